"""The conformance harness's pure parts: reading the test-runner's output, judging it
against the list, the list's own checks, and the docs table being current."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance import doctable
from tests.conformance.expectations import (
    ExpectationsError,
    Expected,
    Listener,
    Mode,
    Suite,
    load_suite,
    parse_suite,
)
from tests.conformance.outcomes import Outcome, Result, has_summary, parse_output
from tests.conformance.runner import librdkafka_version, numbers_of
from tests.conformance.verdict import judge

GRN, RED, CYA, MAG, CLR = "\033[32m", "\033[31m", "\033[36m", "\033[35m", "\033[0m"


def row(name: str, state: str, secs: float, colour: str, rest: str = "") -> str:
    """One summary row exactly as test_summary() in librdkafka's tests/test.c prints it."""
    line = f"|{colour} {name:<40} | {state:>10} | {secs:7.3f}s {CLR}|"
    if rest:
        line += f"{colour} {rest}{CLR}"
    return line


def summary(*rows: str) -> str:
    bar = "#" + "=" * 66 + "#"
    return "\n".join(["TEST 20261127170000 (bare, scenario default) SUMMARY", bar, *rows, bar])


OUTPUT = "\n".join([
    "[0081_admin / 12.345s] Using topic rdkafkatest_rnd1_0081",
    f"{RED}### Test \"0081_admin (do_test_DescribeConfigs:1234)\" failed at 0081-admin.c:"
    f"1300:do_test_DescribeConfigs() at Fri Nov 27 17:00:00 2026: ###",
    "DescribeConfigs failed: Broker: Unsupported version",
    summary(
        row("<MAIN>", "PASSED", 40.0, GRN),
        row("0080_admin_ut", "SKIPPED", 0.0, CYA, "Filtered due to negative test flags"),
        row("0081_admin", "FAILED", 39.9, RED,
            "do_test_DescribeConfigs:1234: DescribeConfigs failed: Unsupported version"),
        row("0097_ssl_verify", "SKIPPED", 0.0, CYA, "Test requires SSL support"),
        row("0101_fetch_from_follower", "SKIPPED", 0.0, CYA,
            "not applicable for broker version 2.4.0.0"),
        row("0012_produce_consume", "PASSED", 3.5, GRN),
        # skipped silently (another scenario), printed because its name starts with TESTS
        row("0045_subscribe_update_topic_remove", "SKIPPED", 0.0, CYA),
    ),
])


def test_summary_rows_become_outcomes_and_filtered_tests_are_no_result() -> None:
    got = parse_output(OUTPUT)
    assert set(got) == {"0081_admin", "0097_ssl_verify", "0012_produce_consume"}
    assert got["0012_produce_consume"] == Outcome(name="0012_produce_consume",
                                                  result=Result.PASSED, seconds=3.5)
    assert got["0081_admin"].result is Result.FAILED
    assert "DescribeConfigs failed" in got["0081_admin"].detail
    assert got["0097_ssl_verify"].result is Result.SKIPPED
    assert got["0097_ssl_verify"].detail == "Test requires SSL support"


def test_a_timed_out_test_takes_its_message_and_the_last_table_wins() -> None:
    # The runner prints a table when a test times out (its row has no reason yet), the
    # failure line, and dies; an earlier table had the test still running.
    text = "\n".join([
        summary(row("0045_subscribe_update", "RUNNING", 10.0, MAG),
                row("0045_resubscribe_with_regex", "PASSED", 8.0, GRN)),
        summary(row("0045_subscribe_update", "FAILED", 150.0, RED),
                row("0045_subscribe_many_updates", "RUNNING", 20.0, MAG),
                row("0045_resubscribe_with_regex", "PASSED", 8.0, GRN)),
        f"{RED}### Test \"0045_subscribe_update\" failed at test.c:1559:check_test_timeouts() "
        "at Fri Nov 27 17:00:00 2026: ###",
        "Test 0045_subscribe_update timed out (timeout set to 150 seconds)",
    ])
    got = parse_output(text)
    assert got["0045_subscribe_update"].result is Result.FAILED
    assert got["0045_subscribe_update"].detail.startswith("Test 0045_subscribe_update timed out")
    assert got["0045_subscribe_many_updates"].result is Result.FAILED
    assert "still running" in got["0045_subscribe_many_updates"].detail
    assert got["0045_resubscribe_with_regex"].result is Result.PASSED


def test_output_without_a_summary_has_no_outcomes() -> None:
    # a runner that died before its table: the harness fills in its listed tests
    text = "\n".join([
        "[0001_multiobj / 0.1s] Created kafka instance",
        f"{RED}### Test \"0001_multiobj\" failed at 0001-multiobj.c:80:main() at "
        "Fri Nov 27 17:00:00 2026: ###",
        "rd_kafka_new() failed",
        "Aborted",
    ])
    assert parse_output(text) == {}
    assert not has_summary(text)
    assert has_summary(OUTPUT)


SUITE_TOML = {
    "suite": {"librdkafka": "2.15.0", "broker_version": "2.4.0"},
    "reasons": {
        "configs": {"kind": "api", "item": 3, "text": "DescribeConfigs is not served"},
        "ssl": {"kind": "harness", "text": "needs an SSL listener"},
        "slow": {"kind": "machine", "text": "its timing varies on two cores"},
    },
    "tests": {
        "0012_produce_consume": {"checks": "produce, consume", "quick": "pass"},
        "0081_admin": {"checks": "admin", "quick": "fail", "reason": "configs"},
        "0097_ssl_verify": {"checks": "ssl", "quick": "skip", "reason": "ssl",
                            "listener": "ssl"},
        "0055_producer_latency": {"checks": "latency", "quick": "flaky", "reason": "slow"},
        "0019_list_groups": {"checks": "groups", "quick": "pass", "full": "fail",
                             "reason": "configs"},
    },
}


def suite() -> Suite:
    return parse_suite(SUITE_TOML)


def out(name: str, result: Result, detail: str = "") -> Outcome:
    return Outcome(name=name, result=result, detail=detail)


def test_results_that_match_the_list_make_a_clean_verdict() -> None:
    got = {o.name: o for o in [out("0012_produce_consume", Result.PASSED),
                               out("0081_admin", Result.FAILED),
                               out("0097_ssl_verify", Result.SKIPPED),
                               out("0055_producer_latency", Result.FAILED),
                               out("0019_list_groups", Result.PASSED)]}
    v = judge(suite(), Mode.QUICK, got, ["0012", "0081", "0097", "0055", "0019"])
    assert v.is_ok
    assert sorted(v.as_listed) == sorted(got)
    assert v.count(Result.PASSED) == 2


def test_a_listed_pass_that_fails_is_a_regression_and_fails_the_run() -> None:
    v = judge(suite(), Mode.QUICK, {"0012_produce_consume": out(
        "0012_produce_consume", Result.FAILED, "consumed 9 of 10")}, ["0012"])
    assert not v.is_ok
    assert [f.name for f in v.regressions] == ["0012_produce_consume"]
    assert "consumed 9 of 10" in v.regressions[0].describe()


def test_a_listed_failure_that_passes_is_reported_without_failing_the_run() -> None:
    v = judge(suite(), Mode.QUICK, {"0081_admin": out("0081_admin", Result.PASSED)}, ["0081"])
    assert v.is_ok
    assert [f.name for f in v.surprises] == ["0081_admin"]


def test_a_test_missing_from_the_list_is_an_error() -> None:
    v = judge(suite(), Mode.QUICK, {"0013_null_msgs": out("0013_null_msgs", Result.PASSED)},
              ["0013"])
    assert not v.is_ok
    assert [f.name for f in v.unlisted] == ["0013_null_msgs"]


def test_a_listed_test_the_runner_did_not_report_is_an_error() -> None:
    v = judge(suite(), Mode.QUICK, {}, ["0012"])
    assert not v.is_ok
    assert [f.name for f in v.silent] == ["0012_produce_consume"]


def test_a_listed_failure_that_skips_itself_instead_is_an_error() -> None:
    v = judge(suite(), Mode.QUICK, {"0081_admin": out("0081_admin", Result.SKIPPED)}, ["0081"])
    assert not v.is_ok
    assert [f.name for f in v.changed] == ["0081_admin"]


def test_a_runner_that_died_fails_its_listed_tests_with_the_reason() -> None:
    v = judge(suite(), Mode.QUICK, {}, ["0012", "0081"],
              died={"0012": "killed by the harness after 600s", "0081": "SIGSEGV"})
    assert [f.name for f in v.regressions] == ["0012_produce_consume"]
    assert "killed by the harness" in v.regressions[0].describe()
    assert v.as_listed == ["0081_admin"]
    assert not v.silent


def test_only_the_numbers_run_are_judged_and_the_mode_picks_the_expectation() -> None:
    got = {"0019_list_groups": out("0019_list_groups", Result.FAILED)}
    assert judge(suite(), Mode.FULL, got, ["0019"]).is_ok
    assert [f.name for f in judge(suite(), Mode.QUICK, got, ["0019"]).regressions] == [
        "0019_list_groups"]
    assert judge(suite(), Mode.QUICK, got, ["0012"]).silent  # 0019 not judged, 0012 silent


def test_flaky_accepts_a_pass_or_a_failure_but_not_a_skip() -> None:
    for result, ok in ((Result.PASSED, True), (Result.FAILED, True), (Result.SKIPPED, False)):
        v = judge(suite(), Mode.QUICK, {"0055_producer_latency": out(
            "0055_producer_latency", result)}, ["0055"])
        assert v.is_ok is ok


def _with_test(**table: object) -> dict[str, object]:
    data = {**SUITE_TOML, "tests": {**SUITE_TOML["tests"], "0001_multiobj": table}}
    return data


@pytest.mark.parametrize(("table", "words"), [
    ({"checks": "x", "quick": "fail"}, ["0001_multiobj", "needs a `reason`"]),
    ({"checks": "x", "quick": "fail", "reason": "nope"}, ["0001_multiobj", "'nope'",
                                                          "not declared"]),
    ({"checks": "x", "quick": "passes"}, ["0001_multiobj", "'passes'", "pass, fail"]),
    ({"checks": "x", "quick": "pass", "sometimes": 1}, ["0001_multiobj", "sometimes"]),
    ({"checks": "", "quick": "pass"}, ["0001_multiobj", "`checks` is empty"]),
    ({"quick": "pass"}, ["0001_multiobj", "`checks` is missing"]),
    ({"checks": "x", "quick": "pass", "listener": "tls"}, ["0001_multiobj", "'tls'",
                                                           "plaintext, ssl"]),
])
def test_a_bad_entry_is_refused_naming_the_test_and_what_is_wrong(
        table: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_suite(_with_test(**table), "list.toml")
    for word in words:
        assert word in str(info.value)


def test_reasons_are_checked_too() -> None:
    data = {**SUITE_TOML, "reasons": {**SUITE_TOML["reasons"],
                                      "unused": {"kind": "harness", "text": "t"}}}
    with pytest.raises(ExpectationsError, match=r"no test uses: \['unused'\]"):
        parse_suite(data)
    data = {**SUITE_TOML, "reasons": {**SUITE_TOML["reasons"],
                                      "configs": {"kind": "api", "item": [3, 9], "text": "t"}}}
    with pytest.raises(ExpectationsError, match=r"configs.*item of issue 47.*\[3, 9\]"):
        parse_suite(data)
    data = {**SUITE_TOML, "reasons": {**SUITE_TOML["reasons"],
                                      "ssl": {"kind": "harness", "item": 2, "text": "t"}}}
    with pytest.raises(ExpectationsError, match="'ssl': only kind api names an issue item"):
        parse_suite(data)
    with pytest.raises(ExpectationsError, match="not a librdkafka test name"):
        parse_suite({**SUITE_TOML, "tests": {"admin": {"checks": "x", "quick": "pass"}}})


def test_the_suite_says_how_many_gateways_the_cluster_runs() -> None:
    assert suite().gateways == 1
    assert parse_suite({**SUITE_TOML, "suite": {**SUITE_TOML["suite"], "gateways": 3}}
                       ).gateways == 3
    for bad in (0, 10, "3", True):
        with pytest.raises(ExpectationsError, match=r"\[suite\]: `gateways`"):
            parse_suite({**SUITE_TOML, "suite": {**SUITE_TOML["suite"], "gateways": bad}})


def test_a_test_says_which_listener_it_runs_against_plaintext_by_default() -> None:
    s = suite()
    assert s.tests["0097_ssl_verify"].listener is Listener.SSL
    assert s.tests["0012_produce_consume"].listener is Listener.PLAINTEXT
    # the numbers the SSL cluster runs: one test-runner process per number
    assert s.numbers_on(Listener.SSL) == {"0097"}
    assert "0012" not in s.numbers_on(Listener.SSL)


def test_every_test_of_a_number_runs_against_the_same_listener() -> None:
    # one test-runner process runs every test of a number, against one cluster
    data = {**SUITE_TOML, "tests": {**SUITE_TOML["tests"], "0097_ssl_verify_local": {
        "checks": "x", "quick": "pass"}}}
    with pytest.raises(ExpectationsError,
                       match=r"0097_ssl_verify_local.*plaintext.*0097_ssl_verify.*ssl"):
        parse_suite(data, "list.toml")


def test_the_committed_list_loads_and_the_docs_table_is_current() -> None:
    listed = load_suite(doctable.EXPECTATIONS)
    assert listed.counts(Mode.QUICK)[Expected.PASS] > 0
    page = doctable.PAGE.read_text()
    assert doctable.splice(page, doctable.render(listed)) == page, (
        "docs/kafka.md's conformance table is stale: python -m tests.conformance.doctable")


def test_splice_refuses_a_page_without_its_markers() -> None:
    with pytest.raises(ValueError, match="marker lines"):
        doctable.splice("# a page\n", "| table |\n")


def test_test_numbers_and_version_come_from_the_librdkafka_tree(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "rdkafka.h").write_text("#define RD_KAFKA_VERSION  0x020f00ff\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("0001-multiobj.c", "0045-subscribe_update.c", "0053-stats_cb.cpp",
                 "8000-idle.cpp", "test.c", "0045-subscribe_update.o", "xxxx-metadata.cpp"):
        (tests / name).write_text("")
    assert numbers_of(tests) == ["0001", "0045", "0053"]
    assert librdkafka_version(tmp_path) == "2.15.0"


def test_the_ssl_files_are_trivups_signed_by_the_clusters_ca(tmp_path: Path) -> None:
    """The files and SSL_* variables 0097_ssl_verify reads (its envname table,
    SSL_password, SSL_client_auth): the client's certificate chains to the CA that
    ``ledgerd local --kafka-tls`` made, its PEM key needs the password, the PKCS#12
    bundle holds key, certificate and CA under that password, and all_cas.pem has the
    unused CA first."""
    import trustme
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    from tests.conformance.sslfiles import make_ssl_files

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.private_key_pem.write_to_path(str(tmp_path / "ca.key"))
    env, conf = make_ssl_files(tmp_path / "ssl", tmp_path / "ca.pem", tmp_path / "ca.key")
    for var in ("SSL_pkcs", "SSL_pub_der", "SSL_pub_pem", "SSL_priv_der", "SSL_priv_pem",
                "SSL_ca_der", "SSL_all_cas_pem"):
        assert Path(env[var]).is_file(), var
    assert env["SSL_client_auth"] == "required"
    password = env["SSL_password"].encode()
    assert conf["password"] == env["SSL_password"]
    authority = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    chain = x509.load_pem_x509_certificates(Path(conf["certificate"]).read_bytes())
    assert [c.subject for c in chain[1:]] == [authority.subject]  # certificate, then CA
    chain[0].verify_directly_issued_by(authority)
    assert x509.load_der_x509_certificate(Path(env["SSL_pub_der"]).read_bytes()) == chain[0]
    assert x509.load_der_x509_certificate(Path(env["SSL_ca_der"]).read_bytes()) == authority
    pem_key = Path(conf["key"]).read_bytes()
    with pytest.raises(TypeError):
        serialization.load_pem_private_key(pem_key, password=None)  # encrypted
    key = serialization.load_pem_private_key(pem_key, password=password)
    der_key = serialization.load_der_private_key(Path(env["SSL_priv_der"]).read_bytes(), None)
    assert key.public_key() == der_key.public_key() == chain[0].public_key()
    bundle = pkcs12.load_pkcs12(Path(env["SSL_pkcs"]).read_bytes(), password)
    assert bundle.cert is not None and bundle.cert.certificate == chain[0]
    assert [c.certificate for c in bundle.additional_certs] == [authority]
    cas = x509.load_pem_x509_certificates(Path(env["SSL_all_cas_pem"]).read_bytes())
    assert len(cas) == 2 and cas[1] == authority and cas[0] != authority
    ou = chain[0].subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME)
    assert [a.value for a in ou] == ["0:client,admin"]  # the gateway's roles
