"""``looprelay up``'s connection cap follows the descriptor limit, or ``server.maxConnections``
(issue 22, 6): a fixed 2,048 held about 680 default agents whatever ``ulimit -n`` allowed."""

from __future__ import annotations

import resource

from looprelay.app.server import FD_CEILING, FD_RESERVE, MIN_CONNECTIONS, connection_cap
from looprelay.config.model import ServerConfig


def _soft() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return FD_CEILING if soft == resource.RLIM_INFINITY else soft


class TestConnectionCap:
    def test_unset_it_is_what_the_descriptor_limit_allows_once_raised(self) -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

        cap = connection_cap(None)

        assert cap == _soft() - FD_RESERVE
        if hard != resource.RLIM_INFINITY:
            assert _soft() == min(hard, FD_CEILING)  # raised to the hard limit

    def test_a_setting_within_the_limit_is_kept(self) -> None:
        assert connection_cap(100) == 100

    def test_a_setting_past_the_limit_is_cut_to_it(self) -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY:
            return  # nothing to cut to
        assert connection_cap(hard * 2) == max(_soft() - FD_RESERVE, MIN_CONNECTIONS)

    def test_the_setting_defaults_to_following_the_limit(self) -> None:
        assert ServerConfig().max_connections is None
        assert ServerConfig.model_validate({"maxConnections": 5000}).max_connections == 5000
