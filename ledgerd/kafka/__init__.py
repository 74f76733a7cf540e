"""The Kafka gateway: the Kafka wire protocol over ledgerd logs (docs/kafka.md).

- ``schema`` / ``api``: Kafka message schemas declared once, the codec that walks them;
- ``records``: RecordBatch v2 (split, CRC-32C, re-offset);
- ``partitions``: a partition as a log (appends, offsets, reads);
- ``groups``: the classic consumer-group protocol as a state machine, and what the
  group admin APIs may say and delete;
- ``compression``: a topic's ``compression.type`` applied to produced batches;
- ``acls`` / ``authorization`` / ``acl_admin``: Kafka's ACLs (decisions, what each
  request needs, the ACL APIs and the authorizer the gateway judges by);
- ``refusals``: the reply refusing a whole request (a version not served, a denial);
- ``gateway``: the trio server (``ledgerd gateway --conf F``).
"""

from ledgerd.kafka.config import GatewayConfig

__all__ = ["GatewayConfig"]
