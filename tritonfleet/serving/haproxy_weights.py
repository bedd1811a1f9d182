"""A traffic share for canary hosts through HAProxy's server weights (its runtime API).

HAProxy sends each server "a load proportional to their weight relative to the sum of all
weights" (configuration manual, ``weight``: default 1, at most 256, 0 takes the server out of load
balancing); with ``balance roundrobin`` the weights are dynamic and the share is exact over a
cycle of requests (``balance``: "Each server is used in turns, according to their weights"; a
``static-rr`` backend accepts only 0 and the initial weight at run time). The runtime API's
``set weight <backend>/<server> <weight>`` takes an absolute weight 0-256, ``get weight`` reports
"the current weight and the initial weight", and ``show servers state <backend>`` lists both for
every server (``srv_uweight``, ``srv_iweight``). Sources: HAProxy 2.6 management guide, section 9.3
(https://docs.haproxy.org/2.6/management.html#9.3; the same text ships in Debian's haproxy package
as /usr/share/doc/haproxy/management.txt.gz) and configuration manual sections 4.2 ``balance``
and 5.2 ``weight`` (https://docs.haproxy.org/2.6/configuration.html). Exercised against Debian 12's
haproxy 2.6 (tests/unit/serving/test_haproxy_weights.py).

A share of a few percent with a handful of servers needs the other servers' weights raised
(with weight 1 each, the smallest canary weight of 1 already takes 1/(n+1)): :func:`plan` keeps
the other servers' proportions, multiplies them by the smallest factor that reaches the share
within the weights' resolution, and the original weights are put back afterwards
(:meth:`Weights.restore`). Baseline servers can be "matched": given the canaries' weight, so
they serve the old release under the canary's load (a request's time in Triton depends on the
load through dynamic batching: a lightly loaded canary compared with busy hosts looks slower).
The drain's runtime-API client (tritonfleet.serving.drain) sends the commands.

What cannot be read is never taken for a value: a server whose weight or admin state HAProxy does
not report is an error (a weight read as 0 would be "put back" as 0, taking the server out).
"""

from __future__ import annotations

from dataclasses import dataclass

from .drain import DrainError, RuntimeAPI, parse_servers_state, parse_stat

MAX_WEIGHT = 256  # HAProxy's largest server weight


@dataclass(frozen=True)
class WeightPlan:
    """Weights for a share: every canary server and every matched baseline server gets
    ``canary``, each other server its weight times ``factor``. ``share`` is the canary servers'
    resulting part of the traffic (the matched servers get as much)."""

    canary: int
    factor: int
    share: float
    weights: dict[str, int]  # server -> weight to set


def plan(share: float, canaries: list[str], others: dict[str, int], matched: list[str] | None = None) -> WeightPlan:
    """The weights that give ``canaries`` (together) ``share`` (0 < share < 1) of the traffic
    next to ``others`` ({server: its weight now}, servers that take traffic). ``matched``: servers
    of ``others`` that get the canaries' weight too (a baseline under the same load as the
    canary); the rest keep their proportions, times one factor. The closest share the integer
    weights 1-256 allow; among equally close ones the smallest change to the others (the
    smallest factor). ValueError when there is nothing to share with."""
    if not 0 < share < 1:
        raise ValueError(f"a canary share must be between 0 and 1 (exclusive), not {share!r}")
    if not canaries:
        raise ValueError("no canary server to give a share to")
    matched = [m for m in matched or [] if m not in canaries]
    live = {s: w for s, w in others.items() if w > 0 and s not in canaries and s not in matched}
    if not live:
        raise ValueError(
            "no other server takes traffic: a canary share needs at least one baseline server"
            + (" beside the matched ones" if matched else "")
        )
    if share * (len(canaries) + len(matched)) / len(canaries) >= 1:
        raise ValueError(
            f"a share of {share * 100:g}% for the canaries and as much for {len(matched)} matched "
            "baseline server(s) leaves nothing for the others"
        )
    n = len(canaries) + len(matched)  # servers at the canary weight
    total = sum(live.values())
    top = max(live.values())
    best: tuple[float, int, int] | None = None  # (error, factor, canary weight)
    for factor in range(1, MAX_WEIGHT // top + 1):
        # canary weight c: len(canaries) * c / (n * c + factor * total) = share
        ideal = share * factor * total / (len(canaries) - share * n)
        for c in {max(1, min(MAX_WEIGHT, int(ideal))), max(1, min(MAX_WEIGHT, int(ideal) + 1))}:
            got = len(canaries) * c / (n * c + factor * total)
            err = abs(got - share)
            if best is None or err < best[0] - 1e-12:
                best = (err, factor, c)
    if best is None:  # the loop runs at least once (top <= MAX_WEIGHT): no share was found
        raise ValueError(f"no weights in 1-{MAX_WEIGHT} give the canaries a share next to {others}")
    _, factor, c = best
    weights = {s: c for s in [*canaries, *matched]}
    weights.update({s: w * factor for s, w in live.items()})
    return WeightPlan(c, factor, len(canaries) * c / (n * c + factor * total), weights)


def share_of(weights: dict[str, int], servers: list[str]) -> float:
    """The part of the traffic ``servers`` get with ``weights`` (of the servers that take traffic)."""
    total = sum(w for w in weights.values() if w > 0)
    return sum(weights.get(s, 0) for s in servers) / total if total else 0.0


class Weights:
    """The server weights of one backend on every HAProxy instance in front of it."""

    def __init__(self, sockets: list[str], backend: str, timeout: float = 5.0):
        if not sockets:
            raise DrainError("a canary share needs lb = 'haproxy' and lb_haproxy_sockets (the runtime API)")
        self.apis = [RuntimeAPI(s, timeout) for s in sockets]
        self.backend = backend

    def read(self) -> dict[str, dict[str, dict]]:
        """{instance address: {server: {"weight", "initial", "serving"}}}: the user weight and the
        initial weight (``show servers state``) and whether HAProxy sends the server requests
        now (``show stat``: UP or no check, not drained, not in maintenance)."""
        out = {}
        for api in self.apis:
            stat = {
                r.get("svname"): r
                for r in parse_stat(api.command("show stat"))
                if r.get("pxname") == self.backend and r.get("svname") not in ("FRONTEND", "BACKEND")
            }
            if not stat:
                raise DrainError(
                    f"HAProxy at {api.address} has no backend {self.backend!r} or no server in it (lb_haproxy_backend)"
                )
            rows = [
                r
                for r in parse_servers_state(api.command(f"show servers state {self.backend}"))
                if r.get("be_name") == self.backend
            ]
            servers = {}
            for r in rows:
                name = r.get("srv_name", "")
                fields = [r.get(k, "") for k in ("srv_admin_state", "srv_uweight", "srv_iweight")]
                if not name or not all(str(f).isdigit() for f in fields):
                    raise DrainError(
                        f"HAProxy at {api.address}: `show servers state {self.backend}` gives no "
                        f"admin state or weights for server {name!r}: {r}"
                    )
                admin, weight, initial = (int(f) for f in fields)
                status = stat.get(name, {}).get("status", "")
                servers[name] = {
                    "weight": weight,
                    "initial": initial,
                    "serving": not admin and (status.startswith("UP") or status == "no check"),
                }
            out[api.address] = servers
        return out

    def current(self) -> dict[str, int]:
        """{server: weight} as the first instance has them (every instance is set alike)."""
        first = next(iter(self.read().values()))
        return {s: v["weight"] for s, v in first.items()}

    def set(self, weights: dict[str, int]) -> None:
        """Set each server's weight on every instance; DrainError naming the instance and the
        server when HAProxy refuses or does not take the value (a static-rr backend)."""
        for server, w in weights.items():
            if not 0 <= int(w) <= MAX_WEIGHT:
                raise DrainError(f"weight {w} for {self.backend}/{server} is outside HAProxy's 0-{MAX_WEIGHT}")
            if any(c.isspace() or c in "/;" for c in server) or not server:
                raise DrainError(f"HAProxy server names must be plain words, not {server!r}")
        for api in self.apis:
            for server, w in weights.items():
                answer = api.command(f"set weight {self.backend}/{server} {int(w)}").strip()
                if answer:
                    raise DrainError(
                        f"HAProxy at {api.address} refused `set weight {self.backend}/{server} {int(w)}`: {answer}"
                    )
            now = {s: v["weight"] for s, v in self.read()[api.address].items()}
            wrong = {s: (w, now.get(s)) for s, w in weights.items() if now.get(s) != int(w)}
            if wrong:
                raise DrainError(
                    f"HAProxy at {api.address} did not take the weights of backend {self.backend} "
                    f"(wanted, now): {wrong}; a static-rr backend only accepts 0 and the initial "
                    "weight: use balance roundrobin for a canary share"
                )

    def restore(self, originals: dict[str, int]) -> None:
        """Put the weights read before back (servers that are gone are left out)."""
        present = self.current()
        self.set({s: w for s, w in originals.items() if s in present})
