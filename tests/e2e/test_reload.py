"""An uploaded configuration is put in force by warm function instances (the functions run
with TRIBUTARY_CONFIG_CHECK_SECONDS=0 here: checked on every invocation), and one that does
not load is refused while the previous configuration goes on working — without a file of
an unknown table being ignored meanwhile."""

import json
import time
from pathlib import Path

import dms
from conftest import read_table, table_config
from test_pipeline import converge, upload


def test_an_uploaded_configuration_is_used_without_a_cold_start(aws, stack, poller, functions):
    key = "config/tributary.toml"
    original = aws.s3.get_object(Bucket=stack.curated, Key=key)["Body"].read()
    try:
        # Not configured yet: the warm functions ignore the table's files.
        late = dms.Source(seed=31)
        first = dms.seed_files(late, full_load_rows=500, new_rows=20)
        upload(aws, stack, "late", first[:1])
        poller.run_until(lambda: False, timeout=8)
        assert read_table(stack, "late")[0] is None, "a file of an unconfigured table was merged"

        # The table added to the configuration: no redeploy, no cold start.
        added = original + table_config(stack.raw, stack.curated, "late").encode()
        aws.s3.put_object(Bucket=stack.curated, Key=key, Body=added)
        start = time.time()
        upload(aws, stack, "late", first)
        converge(aws, stack, poller, "late", late.state(), "a table added by a configuration upload", start)

        # A broken upload is refused (logged, counted) and the previous configuration stays:
        # files of a table every instance knows are merged...
        log_start = Path(functions.log.name).stat().st_size
        aws.s3.put_object(Bucket=stack.curated, Key=key, Body=added + b"\n[[table]]\nname = 3\n")
        known = dms.Source(seed=32)
        start = time.time()
        upload(aws, stack, "known", dms.seed_files(known, full_load_rows=500, new_rows=20))
        converge(aws, stack, poller, "known", known.state(), "merges go on under a refused configuration", start)
        # ...and a file that no table of the configuration in force owns is not ignored (it
        # may belong to a table of the refused one): retried, then dead-lettered.
        aws.s3.put_object(Bucket=stack.raw, Key="dms/nobody/travel_details/LOAD00000001.parquet",
                          Body=first[0][1])
        dead = []

        def dead_lettered():
            for m in aws.sqs.receive_message(QueueUrl=stack.dlq_url, MaxNumberOfMessages=10,
                                             WaitTimeSeconds=0).get("Messages", []):
                dead.append(json.loads(m["Body"])["Records"][0]["s3"]["object"]["key"])
                aws.sqs.delete_message(QueueUrl=stack.dlq_url, ReceiptHandle=m["ReceiptHandle"])
            return "dms/nobody/travel_details/LOAD00000001.parquet" in dead
        assert poller.run_until(dead_lettered, timeout=120), dead
        functions.log.flush()
        log = Path(functions.log.name).read_text()[log_start:]
        assert "the configuration changed but does not load" in log, log[-3000:]
        assert '"ConfigRejected":1' in log, log[-3000:]
        assert "is not ignored while that is so" in log, log[-3000:]
    finally:
        aws.s3.put_object(Bucket=stack.curated, Key=key, Body=original)
