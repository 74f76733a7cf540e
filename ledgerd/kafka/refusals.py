"""The reply that refuses a whole request with one error code, per API.

Kafka answers a request it cannot serve with the response of that API in which every
entity the request named (topic partition, group, topic) carries the error, and a
top-level error code where the response has one (``AbstractRequest.getErrorResponse``).
The gateway does the same for a request at a version it does not serve but can read
(``api.DECLARED``): Produce v0-2, Fetch v0-3, ListOffsets v0, OffsetCommit v0-1,
OffsetFetch v0, each answered UNSUPPORTED_VERSION, so a client that did not ask
ApiVersions first (librdkafka with ``api.version.request=false``, kafka-python with a
pinned ``api_version``) reads an error instead of a closed connection. Pure: a decoded
request body in, a response body out.
"""

from __future__ import annotations

from typing import Any

from ledgerd.kafka.api import RESPONSES, ApiKey
from ledgerd.kafka.schema import Array

__all__ = ["refusal"]


def _topics(topics: list[dict[str, Any]], *, name: str, parts: str, index: str | None,
            out_name: str = "name", out_parts: str = "partitions",
            out_index: str = "partition_index", **values: Any) -> list[dict[str, Any]]:
    """Each requested topic with each requested partition carrying ``values``
    (``index`` None: the request lists partition numbers, not structs)."""
    return [{out_name: t[name], out_parts: [
        {out_index: p if index is None else p[index], **values} for p in t[parts]]}
        for t in topics]


def refusal(api: ApiKey, body: dict[str, Any], code: int) -> dict[str, Any]:
    """The response body refusing ``body`` (a request of ``api``) with ``code``."""
    reply = _refusal(api, body, code)
    for f in RESPONSES[api].fields:  # arrays the reply has no entity for: empty
        if isinstance(f.kind, Array) and f.default is None:
            reply.setdefault(f.name, [])
    return reply


def _refusal(api: ApiKey, body: dict[str, Any], code: int) -> dict[str, Any]:
    if api is ApiKey.PRODUCE:
        return {"responses": _topics(
            body["topic_data"], name="name", parts="partition_data", index="index",
            out_parts="partition_responses", out_index="index", error_code=code)}
    if api is ApiKey.FETCH:
        responses = _topics(
            body["topics"], name="topic", parts="partitions", index="partition",
            out_name="topic", error_code=code, high_watermark=-1,
            aborted_transactions=[], records=b"")
        for out, t in zip(responses, body["topics"], strict=True):
            out["topic_id"] = t["topic_id"]  # v13+: the client knows it by its id
        return {"error_code": code, "session_id": 0, "responses": responses}
    if api in (ApiKey.LIST_OFFSETS, ApiKey.OFFSET_COMMIT):
        return {"topics": _topics(body["topics"], name="name", parts="partitions",
                                  index="partition_index", error_code=code)}
    if api is ApiKey.OFFSET_FETCH:
        return {"error_code": code, "topics": _topics(
            body["topics"] or [], name="name", parts="partition_indexes", index=None,
            error_code=code, committed_offset=-1, metadata="")}
    if api is ApiKey.METADATA:
        return {"brokers": [], "error_code": code,  # top level: v13+
                "topics": [{"error_code": code, "name": t["name"],
                            "topic_id": t["topic_id"], "partitions": []}
                           for t in body["topics"] or []]}
    if api is ApiKey.OFFSET_FOR_LEADER_EPOCH:
        return {"topics": _topics(body["topics"], name="topic", parts="partitions",
                                  index="partition", out_name="topic",
                                  out_index="partition", error_code=code)}
    if api is ApiKey.CREATE_TOPICS:
        return {"topics": [{"name": t["name"], "error_code": code} for t in body["topics"]]}
    if api is ApiKey.DELETE_TOPICS:
        return {"responses": [{"name": n, "error_code": code} for n in body["topic_names"]]}
    if api is ApiKey.DELETE_GROUPS:
        return {"results": [{"group_id": g, "error_code": code}
                            for g in body["groups_names"]]}
    if api is ApiKey.DESCRIBE_GROUPS:
        return {"groups": [{"group_id": g, "error_code": code} for g in body["groups"]]}
    if api is ApiKey.ADD_PARTITIONS_TO_TXN:
        return {"results": _topics(body["topics"], name="name", parts="partitions",
                                   index=None, out_parts="results", error_code=code)}
    if api is ApiKey.TXN_OFFSET_COMMIT:
        return {"topics": _topics(body["topics"], name="name", parts="partitions",
                                  index="partition_index", error_code=code)}
    if api is ApiKey.WRITE_TXN_MARKERS:
        return {"markers": [{"producer_id": m["producer_id"], "topics": _topics(
            m["topics"], name="name", parts="partition_indexes", index=None,
            error_code=code)} for m in body["markers"]]}
    if api in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        return {"responses": [{"resource_type": r["resource_type"],
                               "resource_name": r["resource_name"], "error_code": code}
                              for r in body["resources"]]}
    if api is ApiKey.DESCRIBE_CONFIGS:
        return {"results": [{"resource_type": r["resource_type"],
                             "resource_name": r["resource_name"], "error_code": code}
                            for r in body["resources"]]}
    if api is ApiKey.CREATE_PARTITIONS:
        return {"results": [{"name": t["name"], "error_code": code} for t in body["topics"]]}
    if api is ApiKey.DELETE_RECORDS:
        return {"topics": _topics(body["topics"], name="name", parts="partitions",
                                  index="partition_index", error_code=code)}
    if api is ApiKey.CREATE_ACLS:
        return {"results": [{"error_code": code} for _ in body["creations"]]}
    if api is ApiKey.DELETE_ACLS:
        return {"filter_results": [{"error_code": code} for _ in body["filters"]]}
    if api is ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS:
        # as Kafka's getErrorResponse: the error, with a message, at the top and for
        # each user asked (librdkafka 2.x crashes on a refusal without them)
        message = f"refused: error {code}"
        return {"error_code": code, "error_message": message, "results": [
            {"user": u["name"], "error_code": code, "error_message": message,
             "credential_infos": []} for u in body["users"] or []]}
    if api is ApiKey.ALTER_USER_SCRAM_CREDENTIALS:
        users = dict.fromkeys(op["name"] for op in [*body["deletions"], *body["upsertions"]])
        return {"results": [{"user": u, "error_code": code} for u in users]}
    if api is ApiKey.DESCRIBE_PRODUCERS:
        return {"topics": _topics(body["topics"], name="name", parts="partition_indexes",
                                  index=None, error_code=code, active_producers=[])}
    if api is ApiKey.DESCRIBE_TRANSACTIONS:
        return {"transaction_states": [{"transactional_id": tid, "error_code": code}
                                       for tid in body["transactional_ids"]]}
    if api is ApiKey.DESCRIBE_LOG_DIRS:
        # v3+: the top-level error, as Kafka's; Kafka answers older versions no log
        # dir at all, indistinguishable from a broker with none: here one nameless
        # dir carries the error, in every version
        return {"error_code": code, "results": [
            {"error_code": code, "log_dir": "", "topics": []}]}
    # every other response has a top-level error code (ListTransactions too)
    return {"error_code": code}
