"""cffi API-mode build script for ``ledgerd.base._tls``: one OpenSSL verify callback.

A ledgerd TLS server that refuses a client certificate (an untrusted CA, an expired
certificate) tells the client so with the ``bad_certificate`` alert (42), as Java's TLS
stack (Kafka's brokers) does, where OpenSSL's own choice follows the verification
error (``unknown_ca``, 48, for an unknown issuer). Python's ``ssl`` module offers no
verify callback, so this module installs one on the ``SSL_CTX`` beneath an
``ssl.SSLContext`` (``ledgerd.base.tls.refuse_as_bad_certificate`` finds it and checks
it is one before use). The callback tells Python the original error and depth first
(``ldn_tls_refused``), so the server's log still says why.

Linked against the system's libssl (``libssl-dev``); like ``_native`` it is optional:
without it the alerts are OpenSSL's own. Its C is here with the other native code; the
module lands in ``ledgerd.base`` beside ``tls.py``, its only user (the bookie, the
client and the Kafka gateway all build their TLS contexts there, and ``ledgerd.base``
imports nothing above it).
"""

from cffi import FFI

ffibuilder = FFI()

ffibuilder.cdef(
    """
    unsigned long ldn_tls_openssl_version(void);
    int ldn_tls_ctx_verify_mode(void *ctx);
    uint64_t ldn_tls_ctx_options(void *ctx);
    void ldn_tls_refuse_as_bad_certificate(void *ctx);
    const char *ldn_tls_error_string(int error);
    extern "Python" void ldn_tls_refused(int error, int depth);
    """
)

ffibuilder.set_source(
    "ledgerd.base._tls",
    r"""
    #include <stdint.h>
    #include <openssl/crypto.h>
    #include <openssl/ssl.h>
    #include <openssl/x509_vfy.h>

    static void ldn_tls_refused(int error, int depth);

    static unsigned long ldn_tls_openssl_version(void) { return OpenSSL_version_num(); }

    static int ldn_tls_ctx_verify_mode(void *ctx) {
        return SSL_CTX_get_verify_mode((SSL_CTX *)ctx);
    }

    static uint64_t ldn_tls_ctx_options(void *ctx) {
        return (uint64_t)SSL_CTX_get_options((SSL_CTX *)ctx);
    }

    static const char *ldn_tls_error_string(int error) {
        return X509_verify_cert_error_string(error);
    }

    /* A failed check of the peer's chain: say which to Python, then fail it as
       "rejected", which OpenSSL answers with the bad_certificate alert. */
    static int ldn_tls_verify(int ok, X509_STORE_CTX *store) {
        if (!ok) {
            int error = X509_STORE_CTX_get_error(store);
            if (error != X509_V_ERR_CERT_REJECTED) {
                ldn_tls_refused(error, X509_STORE_CTX_get_error_depth(store));
                X509_STORE_CTX_set_error(store, X509_V_ERR_CERT_REJECTED);
            }
        }
        return ok;
    }

    static void ldn_tls_refuse_as_bad_certificate(void *ctx) {
        SSL_CTX_set_verify((SSL_CTX *)ctx, SSL_CTX_get_verify_mode((SSL_CTX *)ctx),
                           ldn_tls_verify);
    }
    """,
    libraries=["ssl", "crypto"],
    extra_compile_args=["-O2", "-Wall", "-Werror"],
    optional=True,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
