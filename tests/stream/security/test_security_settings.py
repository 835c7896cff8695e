"""Connection security without a broker: settings from flags, env vars and files, masking, ACL lists, help."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from kafka.errors import KafkaError, TopicAuthorizationFailedError, TransactionalIdAuthorizationFailedError
from typer.testing import CliRunner

from rollout_stream.access import explain_denial
from rollout_stream.acls import (
    producer_permissions,
    reader_permissions,
    render_kafka_acls,
    worker_permissions,
)
from rollout_stream.broker.pki import issue, new_ca
from rollout_stream.cli import app
from rollout_stream.client_properties import load_properties
from rollout_stream.clients import Connection
from rollout_stream.commands.connection import SecurityOptions, security_from_options
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.kafka import AuthorizationFailed, authorization_cause
from rollout_stream.kafka.kafka_python import client_settings, security_settings, translate
from rollout_stream.security import (
    MASK,
    SecretStr,
    SecurityConfigError,
    SecuritySettings,
)

PASSWORD = "pa55-w0rd-that-must-not-leak"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("pki")
    ca = new_ca(d)
    return ca, issue(ca, d, "client", common_name="worker")


def scram(**kw) -> SecuritySettings:
    values = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "worker",
        "sasl_password": PASSWORD,
        **kw,
    }
    return SecuritySettings.from_values(values)


# ---- secrets stay masked ---------------------------------------------------------------------------
def test_secret_values_are_masked_everywhere_they_could_be_printed(pki):
    ca, _ = pki
    settings = scram(ssl_cafile=str(ca.cert))
    conn = Connection("broker:9093", security=settings)
    texts = [
        repr(SecretStr(PASSWORD)),
        str(SecretStr(PASSWORD)),
        f"{SecretStr(PASSWORD)}",
        repr(settings),
        str(settings),
        repr(conn),
        str(settings.describe()),
        repr(client_settings(conn)),
        "%s" % (client_settings(conn),),  # noqa: UP031 - the %-formatting logging uses
    ]
    for text in texts:
        assert PASSWORD not in text
    assert settings.describe()["sasl_password"] == MASK
    assert client_settings(conn)["sasl_plain_password"] == PASSWORD  # what kafka-python gets is the real one
    assert settings.sasl_password.get_secret_value() == PASSWORD


def test_a_plain_str_password_is_refused():
    with pytest.raises(TypeError):
        SecuritySettings(
            protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=PASSWORD
        )  # type: ignore[arg-type]


def test_help_never_shows_secret_environment_values():
    env = {"KAFKA_SASL_PASSWORD": PASSWORD, "KAFKA_SASL_USERNAME": "worker", "COLUMNS": "200"}
    for command in (
        ["run"],
        ["synth"],
        ["topics", "create"],
        ["demo"],
        ["tail"],
        ["dlq", "list"],
        ["dlq", "replay"],
        ["acls", "apply"],
    ):
        result = CliRunner().invoke(app, [*command, "--help"], env=env)
        assert result.exit_code == 0, (command, result.output)
        assert PASSWORD not in result.output
        for flag in ("--kafka-config", "--security-protocol", "--sasl-password-file", "--ssl-cafile"):
            assert flag in result.output, (command, flag)


def test_a_config_error_never_echoes_the_password(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "synth",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--security-protocol",
            "SASL_SSL",
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--sasl-password",
            PASSWORD,
            "--ssl-cafile",
            str(tmp_path / "missing-ca.pem"),
        ],
    )
    assert result.exit_code == 2
    assert PASSWORD not in result.output


# ---- validation ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values,message",
    [
        (
            {"protocol": "SASL_TLS"},
            "security protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL",
        ),
        ({"protocol": "SASL_SSL"}, "needs a SASL mechanism"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "SASL mechanism must be one of"),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "SASL PLAIN needs a user name"),
        (
            {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u"},
            "needs a password for user 'u'",
        ),
        ({"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "OAUTHBEARER needs a token file"),
        ({"protocol": "PLAINTEXT", "sasl_username": "u"}, "does not use SASL"),
        (
            {
                "protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password": "p",
                "ssl_cafile": "/ca.pem",
            },
            "does not use TLS",
        ),
        ({"protocol": "SSL", "ssl_keyfile": "/k.pem"}, "a TLS client key needs its certificate"),
        ({"protocol": "SSL", "ssl_check_hostname": "maybe"}, "must be true or false"),
    ],
)
def test_invalid_settings_are_one_readable_line(values, message):
    with pytest.raises(SecurityConfigError, match=re.escape(message)):
        SecuritySettings.from_values(values)


def test_files_are_checked_when_the_settings_are_used(tmp_path, pki):
    ca, client = pki
    settings = SecuritySettings.from_values({"protocol": "SSL", "ssl_cafile": str(tmp_path / "nope.pem")})
    with pytest.raises(SecurityConfigError, match="cannot load the TLS CA file .*nope.pem.*No such file"):
        security_settings(settings)
    wrong_key = SecuritySettings.from_values(
        {
            "protocol": "SSL",
            "ssl_cafile": str(ca.cert),
            "ssl_certfile": str(client.cert),
            "ssl_keyfile": str(ca.key),
        }
    )
    with pytest.raises(SecurityConfigError, match="cannot load the TLS client certificate"):
        security_settings(wrong_key)
    good = SecuritySettings.from_values(
        {
            "protocol": "SSL",
            "ssl_cafile": str(ca.cert),
            "ssl_certfile": str(client.cert),
            "ssl_keyfile": str(client.key),
            "ssl_check_hostname": "false",
        }
    )
    settings_for_kafka = security_settings(good)
    assert settings_for_kafka["security_protocol"] == "SSL"
    assert settings_for_kafka["ssl_context"].check_hostname is False
    assert settings_for_kafka["ssl_context"].verify_mode.name == "CERT_REQUIRED"  # the chain is still checked


def test_password_files_lose_their_newline_and_must_not_be_empty(tmp_path):
    path = tmp_path / "pw"
    path.write_text(PASSWORD + "\n")
    assert scram(sasl_password=None, sasl_password_file=str(path)).sasl_password == SecretStr(PASSWORD)
    path.write_text("\n")
    with pytest.raises(SecurityConfigError, match="is empty"):
        scram(sasl_password=None, sasl_password_file=str(path))
    with pytest.raises(SecurityConfigError, match="cannot read SASL password file"):
        scram(sasl_password=None, sasl_password_file=str(tmp_path / "missing"))


def test_environment_variables(tmp_path):
    (tmp_path / "pw").write_text(PASSWORD)
    settings = SecuritySettings.from_env(
        {
            "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "KAFKA_SASL_MECHANISM": "scram-sha-256",
            "KAFKA_SASL_USERNAME": "worker",
            "KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw"),
            "KAFKA_SSL_CHECK_HOSTNAME": "false",
            "UNRELATED": "x",
        }
    )
    assert (settings.protocol, settings.sasl_mechanism, settings.sasl_username) == (
        "SASL_SSL",
        "SCRAM-SHA-256",
        "worker",
    )
    assert settings.sasl_password == SecretStr(PASSWORD) and settings.ssl_check_hostname is False
    assert SecuritySettings.from_env({}) == SecuritySettings()


def test_oauthbearer_reads_its_token_file_at_every_login(tmp_path):
    token = tmp_path / "token"
    token.write_text("eyJ.first\n")
    settings = SecuritySettings.from_values(
        {"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_file": str(token)}
    )
    provider = security_settings(settings)["sasl_oauth_token_provider"]
    assert provider.token() == "eyJ.first"
    token.write_text("eyJ.refreshed")
    assert provider.token() == "eyJ.refreshed"
    assert settings.principal is None


# ---- client properties files -----------------------------------------------------------------------
def test_java_client_properties_with_jaas_and_a_pem_trust_store(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text(
        "\n".join(
            [
                "# a Java client file",
                "bootstrap.servers=b1:9093,b2:9093",
                "security.protocol=SASL_SSL",
                "sasl.mechanism=SCRAM-SHA-512",
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
                f'    username="worker" password="{PASSWORD}";',
                "ssl.truststore.type=PEM",
                "ssl.truststore.location=certs/ca.pem",
                "ssl.endpoint.identification.algorithm=",
                "acks=all",
            ]
        )
    )
    values, bootstrap = load_properties(config)
    assert bootstrap == "b1:9093,b2:9093"
    settings = SecuritySettings.from_values(values)
    assert settings.sasl_username == "worker" and settings.sasl_password == SecretStr(PASSWORD)
    assert settings.ssl_cafile == tmp_path / "certs" / "ca.pem"  # relative to the file
    assert settings.ssl_check_hostname is False


def test_librdkafka_names_and_a_java_only_trust_store(tmp_path):
    config = tmp_path / "rdkafka.properties"
    config.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=u\n"
        f"sasl.password={PASSWORD}\nssl.ca.location=/etc/ssl/ca.pem\n"
    )
    settings = SecuritySettings.from_values(load_properties(config)[0])
    assert (settings.sasl_mechanism, settings.ssl_cafile) == ("PLAIN", Path("/etc/ssl/ca.pem"))
    config.write_text("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n")
    with pytest.raises(SecurityConfigError, match="is a JKS truststore, which only Java reads"):
        load_properties(config)


def test_flags_and_env_vars_override_the_config_file(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text(
        "bootstrap.servers=b:9093\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=from-file\nsasl.password=file-password\n"
    )
    (tmp_path / "pw").write_text(PASSWORD)
    settings, bootstrap = security_from_options(
        SecurityOptions(kafka_config=config, sasl_username="from-flag", sasl_password_file=tmp_path / "pw")
    )
    assert bootstrap == "b:9093"
    assert settings.sasl_username == "from-flag" and settings.sasl_password == SecretStr(PASSWORD)
    assert settings.sasl_mechanism == "SCRAM-SHA-512"


def test_cli_reads_the_security_environment(tmp_path):
    """`grouped_options` with `SecurityOptions` gives every flag its env var; a bad one is an `error:` line
    with exit 2."""
    result = CliRunner().invoke(
        app,
        ["topics", "create", "--bootstrap-servers", "127.0.0.1:1"],
        env={"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", **os.environ},
    )
    assert result.exit_code == 2
    assert "needs a SASL mechanism" in result.output


# ---- ACLs ------------------------------------------------------------------------------------------
def test_worker_acls_for_at_least_once_and_route_and_create():
    permissions = worker_permissions(
        input_topic="in",
        output_topic="out",
        dead_letter_topic="dlq",
        group_id="g",
        delivery="at-least-once",
        route_topic="zero",
        create_topics=True,
        idempotent_write=True,
    )
    assert [str(p) for p in permissions] == [
        "READ on topic 'in'",
        "READ on group 'g'",
        "WRITE on topic 'out'",
        "WRITE on topic 'dlq'",
        "WRITE on topic 'zero'",
        "CREATE on topic 'in'",
        "CREATE on topic 'out'",
        "CREATE on topic 'dlq'",
        "CREATE on topic 'zero'",
        "IDEMPOTENT_WRITE on cluster",
    ]


def test_producer_and_reader_acls_render_as_kafka_acls_commands():
    lines = render_kafka_acls(
        "User:trainer",
        reader_permissions(output_topic="train-data", group_id="t"),
        bootstrap="b:9093",
        command_config="/etc/kafka/admin client.properties",
    )
    assert lines == [
        "# read train samples",
        "kafka-acls.sh --bootstrap-server b:9093 --command-config '/etc/kafka/admin client.properties' --add "
        "--allow-principal User:trainer --operation Read --topic train-data",
        "# commit each rank's position",
        "kafka-acls.sh --bootstrap-server b:9093 --command-config '/etc/kafka/admin client.properties' --add "
        "--allow-principal User:trainer --operation Read --group t-rank --resource-pattern-type prefixed",
        "# say which groups the trainer group consumed, for paced producers (docs/pacing.md)",
        "kafka-acls.sh --bootstrap-server b:9093 --command-config '/etc/kafka/admin client.properties' --add "
        "--allow-principal User:trainer --operation Write --topic train-data.admission",
        "# publish the trainer group's progress (docs/pacing.md)",
        "kafka-acls.sh --bootstrap-server b:9093 --command-config '/etc/kafka/admin client.properties' --add "
        "--allow-principal User:trainer --operation Write --topic train-data.progress",
    ]
    assert [str(p) for p in producer_permissions(input_topic="rollouts")] == ["WRITE on topic 'rollouts'"]
    assert [str(p) for p in producer_permissions(input_topic="rollouts", paced_to_output_topic="t")] == [
        "WRITE on topic 'rollouts'", "READ on topic 't.admission'", "WRITE on topic 't.admission'",
        "WRITE on topic 't.progress'"]


def test_runtime_denials_become_one_line_naming_the_permission():
    config = WorkerConfig(topics=TopicNames("in", "out", "dlq"), group_id="g", instance_id="i1")
    conn = Connection(
        "b:9093",
        security=SecuritySettings.from_values(
            {
                "protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "w",
                "sasl_password": PASSWORD,
            }
        ),
    )
    wrapped = KafkaError(
        "Cannot perform send because at least one previous transactional or idempotent request "
        "has failed with errors.",
        TopicAuthorizationFailedError({"out"}),
    )
    failure = translate(wrapped)  # as the seam hands it over
    cause = authorization_cause(failure)
    assert isinstance(cause, AuthorizationFailed) and cause.resource == "topic"
    assert cause.kind == "TopicAuthorizationFailedError"
    line = explain_denial(failure, conn, config)
    assert line is not None and line.startswith("the broker refused User:w: missing WRITE on topic 'out' ")
    assert "rollout-stream acls print --principal User:w --group-id g" in line
    assert "WRITE on transactional id 'rollout-stream-g-i1'" in explain_denial(
        translate(TransactionalIdAuthorizationFailedError()), conn, config
    )
    assert explain_denial(translate(KafkaError("other")), conn, config) is None


def test_acls_print_for_a_paced_producer_adds_the_admission_log_and_the_progress_topic():
    args = ["acls", "print", "--principal", "User:rollout", "--role", "producer", "--output-topic", "td"]
    plain = CliRunner().invoke(app, args)
    paced = CliRunner().invoke(app, [*args, "--paced"])
    assert plain.exit_code == paced.exit_code == 0, (plain.output, paced.output)
    assert "td.progress" not in plain.stdout and "td.admission" not in plain.stdout
    assert "--operation Read --operation Write --topic td.admission" in paced.stdout
    assert "--operation Write --topic td.progress" in paced.stdout
