"""A Spark driver that copies log A to log B with a transformation, until killed.

    python -m tests.spark.stream_copy --zk ZK --src A --dst B --checkpoint DIR

Used by tests/spark/test_stream_write.py as a real driver process that a test can kill
(SIGKILL to its process group: the driver, its JVM and the Python workers) and start
again from the same checkpoint. Each output payload is ``b"copy:" + input payload``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--dst", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--password", default="pw")
    parser.add_argument("--trigger", default="500 milliseconds")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import ledgerd.spark

    # Spark's scratch files beside the checkpoint (the test's directory), not in /tmp.
    local = os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "spark-local")
    os.makedirs(local, exist_ok=True)
    spark = (SparkSession.builder.master("local[2]").appName("ledgerd-stream-copy")
             .config("spark.local.dir", local)
             .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={local}")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ledgerd.spark.register(spark)
    source = (spark.readStream.format("ledgerd").option("zk", args.zk).option("log", args.src)
              .option("password", args.password).option("maxEntriesPerTrigger", "400").load())
    copied = source.select(F.concat(F.lit(b"copy:"), F.col("payload")).alias("payload"))
    query = (copied.writeStream.format("ledgerd").option("zk", args.zk)
             .option("log", args.dst).option("password", args.password)
             .option("ensemble_size", "3").option("write_quorum", "2").option("ack_quorum", "2")
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=args.trigger).start())
    print(f"query {query.id} started", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        if not query.isActive:
            print(f"query ended: {query.exception()}", flush=True)
            sys.exit(1)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
