"""The local development broker of ./.kafka-data, for the commands that may use it when given no address.

Two lookups, handed to `connection_from_options(..., local=...)`:

* `running_local_broker`: the operator commands (topics, synth, dlq, tail, lag, prompts, acls) use the broker
  (or cluster) running from ./.kafka-data, and never start one.
* `started_local_broker`: `demo` starts it when it is not running.

`run` imports neither, nor this module: a worker whose address went missing must refuse to start, not start
its own Kafka (tests/test_layout.py checks that nothing `run` imports reaches rollout_stream.broker).
"""

from __future__ import annotations

import sys

from rollout_stream.broker import DEFAULT_DATA_DIR, BrokerConfigError, BrokerError, LocalBroker, PortInUse
from rollout_stream.broker.cluster import LocalCluster, is_cluster
from rollout_stream.commands.options import fail
from rollout_stream.errors import described
from rollout_stream.security import SecuritySettings

__all__ = ["running_local_broker", "started_local_broker"]


def running_local_broker(security: SecuritySettings) -> str | None:
    """The address of the broker (or of the cluster's running nodes) running from ./.kafka-data; None when
    none runs. Creates nothing. A PLAINTEXT connection to a secured broker is refused, naming the file to
    pass."""
    if is_cluster(DEFAULT_DATA_DIR):
        cluster = LocalCluster(data_dir=DEFAULT_DATA_DIR)
        running = [f"127.0.0.1:{node.port}" for node in cluster.status() if node.running]
        return ",".join(running) or None
    broker = LocalBroker(data_dir=DEFAULT_DATA_DIR)
    status = broker.status()
    if not (status.running and status.bootstrap):
        return None
    _refuse_plaintext_to_secure(broker, status.secure, security)
    return status.bootstrap


def started_local_broker(security: SecuritySettings) -> str:
    """The address of the broker of ./.kafka-data, started when it is not running (`demo`).

    A BrokerConfigError when it cannot start until something changes (its port is taken, no Java; exit 2), a
    BrokerError otherwise (exit 1). A taken port is explained for a command that has no --port: the address
    to pass instead, and whose port it is.
    """
    broker = LocalBroker(progress=lambda line: print(line, file=sys.stderr))
    if is_cluster(broker.data_dir):  # `broker start --nodes N` made it a cluster: start what is down
        with described(BrokerError, "no --bootstrap-servers given and the local cluster could not start"):
            return LocalCluster(data_dir=broker.data_dir, progress=broker.progress).start()
    # the innermost description wins: a BrokerConfigError "cannot start", any other BrokerError "could not"
    with described(BrokerError, "no --bootstrap-servers given and the local broker could not start"), \
            described(BrokerConfigError, "no --bootstrap-servers given and the local broker cannot start"):
        try:
            address = broker.ensure_running()
        except PortInUse as exc:
            here = f"no --bootstrap-servers given and no local broker runs from {broker.data_dir}"
            holder = exc.holder
            if holder is None:
                fail(f"{here}; it cannot start there: port {exc.port} on 127.0.0.1 is in use by another "
                     f"process (if that is Kafka, pass --bootstrap-servers 127.0.0.1:{exc.port})")
            use = (f"--kafka-config {holder.data_dir / 'secure' / 'worker.properties'}" if holder.secure
                   else f"--bootstrap-servers 127.0.0.1:{exc.port}")
            fail(f"{here}; port {exc.port} is taken by the local broker from {holder.data_dir} "
                 f"(pid {holder.pid}): to use that one, pass {use}")
    _refuse_plaintext_to_secure(broker, broker.status().secure, security)
    return address


def _refuse_plaintext_to_secure(broker: LocalBroker, secure: bool, security: SecuritySettings) -> None:
    if secure and security.protocol == "PLAINTEXT":
        client = broker.data_dir / "secure" / "worker.properties"
        fail(f"the local broker in {broker.data_dir} is secured (SASL_SSL): pass --kafka-config {client} "
             "(or admin.properties next to it)")
