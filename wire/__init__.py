"""The wire protocol: frames declared with construct, status codes, digests, sans-IO connections."""
