"""Securing the API: TLS (and mutual TLS) on the gRPC port, bearer tokens per service, over real gRPC
on loopback with real certificates (tests/certs.py), the real CLI and a real `gosched agent`."""

import contextlib
import queue
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import ValidationError
from typer.testing import CliRunner

from gosched import Client
from gosched.api import convert, errors
from gosched.api.channel import ChannelSecurity, open_channel
from gosched.api.server import ServerHandle, serve
from gosched.cli import master_cmds
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from gosched.common.config import Settings, load_settings
from gosched.common.node import make_node
from gosched.common.secret_files import SecretFileError
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc
from tests.certs import Authority, Pair
from tests.test_agent_gateway import agent_program, connected, start_master, wait_for

API_TOKENS = ("api-token-old", "api-token-new")  # two lines: a token being rotated
AGENT_TOKEN = "agent-token-1"
WRONG = "not-a-token-of-this-master"
JOB = {"command": "true", "cpu": "1"}  # no nodes: it stays pending, which is all a listing needs


@dataclass(frozen=True)
class Pki:
    ca: Authority
    server: Pair
    client: Pair  # signed by `ca`
    stranger: Pair  # signed by another CA
    other_ca: Authority
    api_tokens: Path
    agent_tokens: Path
    wrong_token: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = Authority.make(root / "ca")
    other = Authority.make(root / "other", "other CA")
    files = {"api.tokens": "\n".join(API_TOKENS) + "\n", "agent.tokens": f"{AGENT_TOKEN}\n", "wrong": WRONG}
    for name, text in files.items():
        (root / name).write_text(text)
    return Pki(
        ca=ca,
        server=ca.server(),
        client=ca.client("client"),
        stranger=other.client("stranger"),
        other_ca=other,
        api_tokens=root / "api.tokens",
        agent_tokens=root / "agent.tokens",
        wrong_token=root / "wrong",
    )


def tls(pki: Pki, *, mutual: bool = False) -> dict[str, Any]:
    """The settings of a TLS master (mutual: clients need a certificate `pki.ca` signed)."""
    more = {"tls_client_ca": str(pki.ca.cert)} if mutual else {}
    return {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key), **more}


def tokens(pki: Pki, *, api: bool = True, agent: bool = True) -> dict[str, Any]:
    return {
        **({"api_token_file": str(pki.api_tokens)} if api else {}),
        **({"agent_token_file": str(pki.agent_tokens)} if agent else {}),
    }


@contextlib.contextmanager
def master(tmp_path: Path, **settings: Any) -> Iterator[ServerHandle]:
    handle = start_master(tmp_path / "auth.db", node_timeout_s=60, **settings)
    try:
        yield handle
    finally:
        handle.stop()


def register(target: str, name: str, security: ChannelSecurity | None = None) -> agent_pb2.RegisterResponse:
    """One AgentService call, as an agent registers."""
    with open_channel(target, security) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        node = convert.node_to_proto(make_node(name, 1000, 2**30))
        reply: agent_pb2.RegisterResponse = stub.Register(agent_pb2.RegisterRequest(node=node), timeout=10)
        return reply


# == TLS ===========================================================================================
def test_a_client_trusting_the_ca_submits_and_lists_over_tls(pki: Pki, tmp_path: Path) -> None:
    with (
        master(tmp_path, **tls(pki)) as handle,
        Client(handle.target, timeout=10, tls_ca=str(pki.ca.cert)) as client,
    ):
        job = client.submit(JOB)
        assert [info.id for info in client.list()] == [job]
        assert client.get(job).id == job


def test_a_plaintext_client_or_one_trusting_another_ca_cannot_reach_a_tls_master(
    pki: Pki, tmp_path: Path
) -> None:
    with master(tmp_path, **tls(pki)) as handle:
        for options in ({}, {"tls_ca": str(pki.other_ca.cert)}):
            with Client(handle.target, timeout=5, **options) as client, pytest.raises(errors.Unavailable):
                client.list()


def test_mutual_tls_wants_a_client_certificate_signed_by_the_client_ca(pki: Pki, tmp_path: Path) -> None:
    ca = str(pki.ca.cert)
    with master(tmp_path, **tls(pki, mutual=True)) as handle:
        for refused in ({}, {"tls_cert": str(pki.stranger.cert), "tls_key": str(pki.stranger.key)}):
            with (
                Client(handle.target, timeout=5, tls_ca=ca, **refused) as client,
                pytest.raises(errors.Unavailable),
            ):
                client.list()
        with Client(
            handle.target, timeout=10, tls_ca=ca, tls_cert=str(pki.client.cert), tls_key=str(pki.client.key)
        ) as client:
            job = client.submit(JOB)
            assert [info.id for info in client.list()] == [job]


# == tokens ========================================================================================
def test_the_api_token_missing_wrong_or_right(pki: Pki, tmp_path: Path) -> None:
    with master(tmp_path, **tls(pki), **tokens(pki)) as handle:
        ca = str(pki.ca.cert)
        with (
            Client(handle.target, timeout=5, tls_ca=ca) as client,
            pytest.raises(errors.Unauthenticated) as missing,
        ):
            client.submit(JOB)
        assert missing.value.code is grpc.StatusCode.UNAUTHENTICATED
        assert "missing API token" in missing.value.message and "api_token_file" in missing.value.message
        with Client(handle.target, timeout=5, tls_ca=ca, token=WRONG) as client:
            with pytest.raises(errors.Unauthenticated) as wrong:
                client.list()
            with pytest.raises(errors.Unauthenticated):  # a stream is guarded as a unary call is
                list(client.watch("any-job", timeout=5))
        assert "wrong API token" in wrong.value.message and WRONG not in wrong.value.message
        # Either line of the file: the old token still works while clients move to the new one.
        for token in API_TOKENS:
            with Client(handle.target, timeout=10, tls_ca=ca, token=token) as client:
                job = client.submit(JOB)
                assert job in [info.id for info in client.list()]
        with Client(handle.target, timeout=10, tls_ca=ca, token_file=str(pki.api_tokens)) as client:
            assert client.status()["ready"]


def test_each_token_guards_its_own_services(pki: Pki, tmp_path: Path) -> None:
    agent_token = ChannelSecurity(token=AGENT_TOKEN)
    api_token = ChannelSecurity(token=API_TOKENS[0])
    with master(tmp_path / "agent-only", **tokens(pki, api=False)) as handle:
        with Client(handle.target, timeout=10) as client:
            assert client.list() == []  # the jobs need no token here
        with pytest.raises(grpc.RpcError) as missing:
            register(handle.target, "n1")
        assert missing.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "missing agent token" in missing.value.details()
        with pytest.raises(grpc.RpcError) as wrong:
            register(handle.target, "n1", api_token)  # the API token is no agent token
        assert "wrong agent token" in wrong.value.details()
        assert register(handle.target, "n1", agent_token).node_name == "n1"
    with master(tmp_path / "api-only", **tokens(pki, agent=False)) as handle:
        assert register(handle.target, "n2").node_name == "n2"  # agents need no token here
        with (
            Client(handle.target, timeout=5, token=AGENT_TOKEN) as client,
            pytest.raises(errors.Unauthenticated, match="wrong API token"),
        ):
            client.list()  # the agent token is no API token
        with Client(handle.target, timeout=10, token=API_TOKENS[1]) as client:
            assert client.list() == []


def test_health_needs_no_token_and_reflection_needs_the_api_token(pki: Pki, tmp_path: Path) -> None:
    with master(tmp_path, **tls(pki), **tokens(pki)) as handle:
        security = ChannelSecurity.from_files(tls_ca=str(pki.ca.cert))
        with open_channel(handle.target, security) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            listing = reflection_pb2.ServerReflectionRequest(list_services="")
            with pytest.raises(grpc.RpcError) as refused:
                list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([listing])))
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with_token = ChannelSecurity.from_files(tls_ca=str(pki.ca.cert), token=API_TOKENS[0])
        with open_channel(handle.target, with_token) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            (reply,) = stub.ServerReflectionInfo(iter([listing]), timeout=10)
            assert "gosched.v1.JobService" in {s.name for s in reply.list_services_response.service}


def test_with_nothing_set_the_api_stays_plaintext_and_open(tmp_path: Path) -> None:
    settings = Settings()
    assert (
        settings.tls_cert,
        settings.tls_client_ca,
        settings.api_token_file,
        settings.agent_token_file,
    ) == (
        None,
        None,
        None,
        None,
    )
    with master(tmp_path) as handle, Client(handle.target, timeout=10) as client:
        assert client.submit(JOB) in [info.id for info in client.list()]
        assert register(handle.target, "n3").node_name == "n3"


# == the agent program =============================================================================
def test_a_real_agent_registers_with_a_master_wanting_mutual_tls_and_its_token(
    pki: Pki, tmp_path: Path
) -> None:
    ca = str(pki.ca.cert)
    secured = ["--tls-ca", ca, "--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    with master(tmp_path, **tls(pki, mutual=True), **tokens(pki)) as handle:
        proc = agent_program(
            handle.target, "secure-1", tmp_path / "a", *secured, "--token-file", str(pki.agent_tokens)
        )
        try:
            with Client(
                handle.target,
                timeout=10,
                tls_ca=ca,
                tls_cert=str(pki.client.cert),
                tls_key=str(pki.client.key),
                token_file=str(pki.api_tokens),
            ) as client:
                wait_for("the agent to register", lambda: connected(client, "secure-1"), timeout=30)
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=15)
        assert "refused" not in out + err, out + err


def test_an_agent_whose_token_is_refused_says_so_and_keeps_trying(pki: Pki, tmp_path: Path) -> None:
    with master(tmp_path, **tls(pki), **tokens(pki)) as handle:
        args = ["--tls-ca", str(pki.ca.cert), "--token-file", str(pki.wrong_token)]
        proc = agent_program(handle.target, "wrong-1", tmp_path / "a", *args)
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        try:
            line = ""
            while "refused" not in line:
                line = lines.get(timeout=30)
            assert "refused this agent's token" in line and "wrong agent token" in line
            assert "--token-file" in line and "retrying" in line and WRONG not in line
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)  # it retries with backoff; it must not give up and exit
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(15)


# == configuration =================================================================================
def bad_settings(pki: Pki, tmp_path: Path) -> list[tuple[dict[str, Any], str]]:
    (tmp_path / "empty").write_text("\n\n")
    (tmp_path / "spaced").write_text("two words\n")
    cert, key = str(pki.server.cert), str(pki.server.key)
    return [
        ({"tls_cert": cert}, "tls_key"),
        ({"tls_key": key}, "tls_cert"),
        ({"tls_client_ca": str(pki.ca.cert)}, "tls_client_ca"),
        ({"tls_cert": key, "tls_key": key}, "tls_cert"),  # a key where the certificate goes
        ({"tls_cert": cert, "tls_key": str(pki.client.key)}, "tls_key"),  # another certificate's key
        ({"tls_cert": cert, "tls_key": key, "tls_client_ca": str(tmp_path / "none.crt")}, "tls_client_ca"),
        ({"api_token_file": str(tmp_path / "absent")}, "api_token_file"),
        ({"api_token_file": str(tmp_path)}, "api_token_file"),  # unreadable: a folder
        ({"agent_token_file": str(tmp_path / "empty")}, "agent_token_file"),
        ({"agent_token_file": str(tmp_path / "spaced")}, "agent_token_file"),
    ]


def test_config_errors_name_the_field(pki: Pki, tmp_path: Path) -> None:
    for values, field in bad_settings(pki, tmp_path):
        with pytest.raises(ValidationError) as refused:
            Settings(**values)
        told = str(refused.value)
        assert f"{field}: " in told, (values, told)
        assert "two words" not in told  # what a token file holds is never echoed


def test_env_and_flags_reach_the_tls_and_token_settings(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOSCHED_API_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(ValidationError, match="api_token_file: cannot read"):
        load_settings()
    monkeypatch.setenv("GOSCHED_API_TOKEN_FILE", str(pki.api_tokens))
    loaded = load_settings(tls_cert=str(pki.server.cert), tls_key=str(pki.server.key))
    assert loaded.api_token_file == str(pki.api_tokens) and loaded.tls_key == str(pki.server.key)

    def no_master(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the master started")

    monkeypatch.setattr(master_cmds, "_start", no_master)
    result = CliRunner().invoke(app, ["master", "--in-process", "--tls-cert", str(pki.server.cert)])
    assert result.exit_code == ExitCode.USAGE and "tls_key: " in result.stderr, result.output


def test_a_token_file_gone_by_the_start_is_named_and_nothing_is_bound(pki: Pki, tmp_path: Path) -> None:
    gone = tmp_path / "api.tokens"
    gone.write_text("t\n")
    settings = Settings(store_path=str(tmp_path / "g.db"), shards=1, api_token_file=str(gone))
    gone.unlink()
    with pytest.raises(SecretFileError, match="api_token_file: cannot read"):
        serve(settings, (), grpc_port=0, http_port=None, host="127.0.0.1", runtime="local")
    assert not list(tmp_path.iterdir())  # no store, no lock: refused before anything was made


# == the CLI's client commands =====================================================================
def test_cli_client_flags_and_env(pki: Pki, tmp_path: Path) -> None:
    runner = CliRunner()
    with master(tmp_path, **tls(pki), **tokens(pki)) as handle:
        base = ["jobs", "--master", handle.target, "--tls-ca", str(pki.ca.cert)]
        with Client(handle.target, timeout=10, tls_ca=str(pki.ca.cert), token=API_TOKENS[0]) as client:
            job = client.submit(JOB)
        ok = runner.invoke(app, [*base, "--token-file", str(pki.api_tokens), "-o", "json"])
        assert ok.exit_code == 0 and job in ok.stdout, ok.output
        by_env = runner.invoke(app, [*base, "-o", "json"], env={"GOSCHED_TOKEN": API_TOKENS[1]})
        assert by_env.exit_code == 0 and job in by_env.stdout, by_env.output
        missing = runner.invoke(app, base, env={"GOSCHED_TOKEN": ""})
        assert missing.exit_code == ExitCode.FAILED, missing.output
        assert "refused the call: missing API token" in missing.stderr and "--token-file" in missing.stderr
        plain = runner.invoke(app, ["status", "--master", handle.target, "--token-file", str(pki.api_tokens)])
        assert plain.exit_code == ExitCode.UNAVAILABLE and "--tls-ca" in plain.stderr, plain.output
    for flags, named in (
        (["--token-file", str(tmp_path / "absent")], "--token-file"),
        (["--tls-ca", str(pki.api_tokens)], "--tls-ca"),  # no certificate in it
        (["--tls-cert", str(pki.client.cert)], "--tls-key"),
    ):
        bad = runner.invoke(app, ["status", "--master", "127.0.0.1:1", *flags])
        assert bad.exit_code == ExitCode.USAGE and f"error: {named}: " in bad.stderr, bad.output
