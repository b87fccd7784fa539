"""Endpoints as vLLM derives them, the observer's source plan, settings and
command-line flags."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.cli import parser
from app.cli.settings import observer_settings_from, settings_from
from app.shared.settings import ObserverSettings, Settings
from blockpool.kvevents.config import (
    KVEventsConfig,
    SourceSpec,
    offset_endpoint_port,
    plan_sources,
    vllm_binds,
)


@pytest.mark.parametrize(
    ("endpoint", "rank", "expected"),
    [
        ("tcp://*:5557", 0, "tcp://*:5557"),
        ("tcp://*:5557", 1, "tcp://*:5558"),
        ("tcp://*:5557", 3, "tcp://*:5560"),
        ("tcp://10.0.0.7:6000", 2, "tcp://10.0.0.7:6002"),
        ("tcp://[::1]:5557", 1, "tcp://[::1]:5558"),
        ("inproc://cache", 0, "inproc://cache"),
        ("inproc://cache", 2, "inproc://cache_dp2"),
        ("ipc:///tmp/kv", 0, "ipc:///tmp/kv"),
    ],
)
def test_rank_offsets_match_vllm(endpoint: str, rank: int, expected: str) -> None:
    assert offset_endpoint_port(endpoint, rank) == expected


def test_ipc_takes_no_rank_offset() -> None:
    with pytest.raises(ValueError, match="only tcp and inproc"):
        offset_endpoint_port("ipc:///tmp/kv", 1)


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://x", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://router.local:5557", False),
    ],
)
def test_bind_or_connect_follows_vllm(endpoint: str, binds: bool) -> None:
    assert vllm_binds(endpoint) is binds
    assert KVEventsConfig(endpoint=endpoint).binds() is binds
    assert KVEventsConfig(endpoint=endpoint, bind="bind").binds() is True
    assert KVEventsConfig(endpoint=endpoint, bind="connect").binds() is False


def test_config_defaults_are_vllms_and_ports_move_with_the_rank() -> None:
    c = KVEventsConfig()
    assert (c.endpoint, c.replay_endpoint, c.buffer_steps, c.hwm, c.max_queue_size, c.topic) == (
        "tcp://*:5557", None, 10_000, 100_000, 100_000, "",
    )  # fmt: skip
    c2 = KVEventsConfig(replay_endpoint="tcp://*:5600", data_parallel_rank=2)
    assert (c2.pub_endpoint, c2.router_endpoint) == ("tcp://*:5559", "tcp://*:5602")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"endpoint": "udp://x:1"}, "must start with tcp://"),
        ({"endpoint": "tcp://host"}, "needs a port"),
        ({"endpoint": "tcp://host:70000"}, "port 70000 is out of range"),
        ({"buffer_steps": 0}, "buffer_steps must be at least 1"),
        ({"hwm": 0}, "hwm must be at least 1"),
        ({"max_queue_size": 0}, "max_queue_size must be at least 1"),
        ({"data_parallel_rank": -1}, "data_parallel_rank must be >= 0"),
        ({"replay_endpoint": "nope"}, "'nope' must start with tcp://"),
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KVEventsConfig(**kwargs)  # type: ignore[arg-type]


def test_plan_expands_dp_ranks_like_vllm_offsets_ports() -> None:
    plan = plan_sources(["tcp://a:5557", "b=tcp://b:7000"], ["tcp://a:5600", "none"], dp_size=3)
    assert plan == [
        SourceSpec("a:5557", "tcp://a:5557", "tcp://a:5600", 0),
        SourceSpec("a:5558", "tcp://a:5558", "tcp://a:5601", 1),
        SourceSpec("a:5559", "tcp://a:5559", "tcp://a:5602", 2),
        SourceSpec("b-dp0", "tcp://b:7000", None, 0),
        SourceSpec("b-dp1", "tcp://b:7001", None, 1),
        SourceSpec("b-dp2", "tcp://b:7002", None, 2),
    ]


@pytest.mark.parametrize(
    ("endpoints", "replays", "dp", "message"),
    [
        ([], None, 1, "at least one"),
        (["tcp://a:1", "tcp://b:2"], ["tcp://a:3"], 1, "one per"),
        (["tcp://*:5557"], None, 1, "give a host"),
        (["x=tcp://a:1", "x=tcp://b:1"], None, 1, "unique"),
        (["tcp://a:5557", "tcp://a:5558"], None, 2, "observed twice"),
        (["bad name=tcp://a:1"], None, 1, "letters"),
        (["tcp://a:1"], None, 0, "dp_size"),
    ],
)
def test_bad_plans_are_refused(
    endpoints: list[str], replays: list[str | None] | None, dp: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_sources(endpoints, replays, dp)


def test_settings_check_the_publisher() -> None:
    s = Settings(kv_events_publisher=True, kv_events_replay_endpoint="none")
    assert s.kv_events_replay_endpoint is None
    assert s.kv_events_config().endpoint == "tcp://*:5557"
    with pytest.raises(ValidationError, match="needs KV events"):
        Settings(kv_events_publisher=True, enable_events=False)
    with pytest.raises(ValidationError, match="must start with"):
        Settings(kv_events_publisher=True, kv_events_endpoint="http://x:1")
    Settings(kv_events_endpoint="http://x:1")  # not checked while off


def test_serve_flags_turn_the_publisher_on() -> None:
    args = parser().parse_args(
        ["serve", "--kv-events-endpoint", "tcp://*:6000", "--kv-events-replay-endpoint",
         "tcp://*:6001", "--kv-events-topic", "kv", "--kv-events-buffer-steps", "5",
         "--kv-events-hwm", "7", "--kv-events-max-queue-size", "9",
         "--kv-events-data-parallel-rank", "1", "--kv-events-bind", "bind"]
    )  # fmt: skip
    s = settings_from(args)
    assert s.kv_events_publisher is True
    cfg = s.kv_events_config()
    assert (cfg.pub_endpoint, cfg.router_endpoint, cfg.topic, cfg.bind) == (
        "tcp://*:6001", "tcp://*:6002", "kv", "bind",
    )  # fmt: skip
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size) == (5, 7, 9)
    off = settings_from(
        parser().parse_args(["serve", "--no-kv-events", "--kv-events-endpoint", "tcp://*:1"])
    )
    assert off.kv_events_publisher is False
    assert settings_from(parser().parse_args(["serve"])).kv_events_publisher is False


def test_observe_flags() -> None:
    args = parser().parse_args(
        ["observe", "tcp://h:5557", "b=tcp://h:6000", "--replay", "tcp://h:5558",
         "--replay", "none", "--dp-size", "2", "--port", "9000", "--token", "t",
         "--topic", "kv", "--no-bootstrap-replay", "--replay-timeout", "1.5"]
    )  # fmt: skip
    s = observer_settings_from(args)
    assert isinstance(s, ObserverSettings)
    assert (s.port, s.token, s.topic, s.bootstrap_replay, s.replay_timeout_s) == (
        9000, "t", "kv", False, 1.5,
    )  # fmt: skip
    assert [(x.name, x.endpoint, x.replay_endpoint) for x in s.sources()] == [
        ("h:5557", "tcp://h:5557", "tcp://h:5558"),
        ("h:5558", "tcp://h:5558", "tcp://h:5559"),
        ("b-dp0", "tcp://h:6000", None),
        ("b-dp1", "tcp://h:6001", None),
    ]
    with pytest.raises(ValidationError, match="one per"):
        observer_settings_from(
            parser().parse_args(["observe", "tcp://h:1", "tcp://h:2", "--replay", "tcp://h:3"])
        )


@pytest.mark.parametrize(
    ("endpoint", "bind", "mode"),
    [
        ("tcp://127.0.0.1:5557", "auto", "connect"),  # loopback under auto: vLLM dials out
        ("tcp://*:5557", "auto", "bind"),
        ("tcp://127.0.0.1:5557", "bind", "bind"),
        ("tcp://*:5557", "connect", "connect"),
    ],
)
def test_mode_says_bind_or_connect(endpoint: str, bind: str, mode: str) -> None:
    assert KVEventsConfig(endpoint=endpoint, bind=bind).mode == mode  # type: ignore[arg-type]


def test_events_format_setting_and_flag() -> None:
    assert KVEventsConfig().events_format == "v016"
    with pytest.raises(ValueError, match="events_format"):
        KVEventsConfig(events_format="json")  # type: ignore[arg-type]
    s = settings_from(parser().parse_args(["serve", "--kv-events-format", "map"]))
    assert s.kv_events_config().events_format == "map"
    assert settings_from(parser().parse_args(["serve"])).kv_events_config().events_format == (
        "v016"
    )
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--kv-events-format", "json"])
