"""Several engines: one ``serve --mirror`` per engine, and the observer's
fleet page linking each instance's card to that engine's dashboard
(``blockpool observe a=tcp://… b=tcp://… --dashboard a=http://… …``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app import cli
from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings
from tests.kvevents.observer_live import client, serving
from tests.support.ports import free_port

pytestmark = pytest.mark.anyio


def two_engines(**kw: list[str]) -> ObserverSettings:
    a, b = free_port(), free_port()
    return ObserverSettings(
        endpoints=[f"a=tcp://127.0.0.1:{a}", f"b=tcp://127.0.0.1:{b}"], port=free_port(), **kw
    )


async def test_each_instance_links_its_engines_dashboard() -> None:
    settings = two_engines(
        dashboards=["a=http://127.0.0.1:8101/", "b=https://mirror-b.example:8443/"]
    )
    async with serving(create_observer_app(settings), settings.port) as app, client(app) as h:
        fleet = (await h.get("/api/fleet")).json()
        links = {i["name"]: i["dashboard_url"] for i in fleet["instances"]}
        assert links == {"a": "http://127.0.0.1:8101/", "b": "https://mirror-b.example:8443/"}
        # the fleet page draws the link on each card from this field
        page = (await h.get("/static/js/fleet/instances.js")).text
        assert "inst.dashboard_url" in page


async def test_an_instance_without_a_dashboard_has_no_link() -> None:
    settings = two_engines(dashboards=["b=http://127.0.0.1:8102/"])
    async with serving(create_observer_app(settings), settings.port) as app, client(app) as h:
        fleet = (await h.get("/api/fleet")).json()
        links = {i["name"]: i["dashboard_url"] for i in fleet["instances"]}
        assert links == {"a": None, "b": "http://127.0.0.1:8102/"}


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("c=http://127.0.0.1:8103/", "names no instance (they are: a, b)"),
        ("a=ftp://host/", "NAME=http(s)://"),
        ("a=http://user:secret@host/", "without credentials"),
        ("http://127.0.0.1:8103/", "NAME=http(s)://"),
    ],
)
def test_a_bad_dashboard_is_refused_at_start(
    item: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        two_engines(dashboards=[item])
    argv = ["observe", "a=tcp://127.0.0.1:5601", "b=tcp://127.0.0.1:5602", "--dashboard", item]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "dashboard" in err and "secret" not in err.replace(item, "")
