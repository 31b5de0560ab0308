"""What the client's own timing says about a run point's latencies, as warning lines.

Two different things, both the client's and not the server's: requests sent later than their schedule
(their ``client_queue``; the server then saw a gentler load), and a client event loop held up while
requests were in flight (openai_probe.py; their tokens were then stamped late, which inflates their TTFT,
TPOT and E2E). The second can happen without the first: an offline point, or a hold-up between sends.
"""

from __future__ import annotations

import numpy as np

from llmbench.bench.backends.openai_probe import STALL_S, LoopLag
from llmbench.bench.records import RequestRecord
from llmbench.bench.repeat_warnings import LAG_WARNING_S


def late_sends(records: list[RequestRecord]) -> str | None:
    """Requests sent later than scheduled by the client itself (no concurrency limit held them)."""
    late = [r.client_queue for r in records if r.client_queue is not None]
    p99 = float(np.percentile(late, 99)) if late else 0.0
    if p99 <= LAG_WARNING_S:
        return None
    return (
        f"the client fell behind the arrival schedule: requests were sent up to {max(late) * 1e3:.1f} ms after "
        f"their scheduled time (p99 {p99 * 1e3:.1f} ms, client queue), so the server saw a gentler load than "
        "the scenario asks. TTFT and E2E count from the send, which leaves this wait out of them but not what "
        "delayed the sends: the same hold-up stamps the tokens of requests in flight late. Fewer requests "
        "per second, or a faster client machine, keep it"
    )


def loop_stalls(lag: LoopLag, records: list[RequestRecord]) -> str | None:
    """A client loop that woke late while requests were in flight: their latencies may be inflated."""
    if lag.max <= LAG_WARNING_S and lag.p99 <= STALL_S:  # neither one long hold-up nor a loop late throughout
        return None
    exposed = [r.client_stall for r in records if r.client_stall is not None and r.client_stall > STALL_S]
    if not exposed:
        return None
    return (
        f"the client's event loop was held up while requests were in flight: it woke up to {lag.max * 1e3:.1f} "
        f"ms late (p99 {lag.p99 * 1e3:.1f} ms) with {len(exposed)} of {len(records)} requests in flight. "
        "Tokens that arrived meanwhile were stamped when it resumed, so those requests' TTFT, TPOT and E2E may "
        f"be inflated by up to {max(exposed) * 1e3:.1f} ms (a busy client machine, or more streams than one "
        "client process can read: fewer requests per second, or a faster client machine)"
    )
