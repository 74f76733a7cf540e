"""A token bucket, time passed in: the per-handle add throttle (BookKeeper's ``throttle``).

``take(now)`` spends one token and returns how long the caller must wait before the
add may go (0 when a token was there). A rate of 0 means unlimited.
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0) -> None:
        if rate < 0:
            raise ValueError(f"throttle rate must be >= 0, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate / 10)
        self.tokens = self.burst
        self.at = now

    def take(self, now: float, n: int = 1) -> float:
        if self.rate == 0:
            return 0.0
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate
