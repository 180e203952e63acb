"""The real CPU engines publish the revision the operator renders, through Boomerang's plugin.

The router pairs P and D by this revision while a rollout runs two (see
`boomerang.router.endpoints.pairable`); without the plugin the page has no such gauge and the
router pairs the engine with any, as before. Both engines are started by the local runtime's
`engine_spec`, with the same environment the operator renders for pods.
"""

from __future__ import annotations

import pytest

from boomerang.local.engine_client import scrape
from boomerang.operator import render
from boomerang.router.health import revision_from_metrics

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def test_both_engines_publish_the_revision_their_environment_names(dataplane):
    expected = render.engine_revision(dataplane.dd)
    for url in (dataplane.p_url, dataplane.d_url):
        assert revision_from_metrics(scrape(url).encode()) == expected, url
