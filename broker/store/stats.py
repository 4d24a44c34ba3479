"""Store statistics behind GET_BROKER_RUNTIME_INFO (RocketMQ ``StoreStatsService``).

Counters only, bumped by the put and get paths; rates are over the whole uptime (Java keeps
sampled windows; the admin tools print both the same way).
"""

from __future__ import annotations

import time

from broker.store.results import GetMessageResult, GetMessageStatus


class StoreStats:
    """Counters for runtime_info (StoreStatsService); TPS over the whole uptime."""

    def __init__(self) -> None:
        self.boot_ms = int(time.time() * 1000)
        self.boot_mono = time.monotonic()
        self.put_times = 0
        self.put_size = 0
        self.put_failed = 0
        self.get_found = 0
        self.get_miss = 0
        self.get_transferred = 0

    def on_put(self, n: int, size: int) -> None:
        self.put_times += n
        self.put_size += size

    def on_get(self, result: GetMessageResult) -> None:
        if result.status is GetMessageStatus.FOUND:
            self.get_found += 1
            self.get_transferred += result.message_count
        else:
            self.get_miss += 1

    def runtime_info(self) -> dict[str, str]:
        up = max(time.monotonic() - self.boot_mono, 1e-3)
        avg = self.put_size / self.put_times if self.put_times else 0.0
        return {
            "bootTimestamp": str(self.boot_ms),
            "runtime": f"[ {int(up)} seconds ]",
            "putMessageTimesTotal": str(self.put_times),
            "putMessageSizeTotal": str(self.put_size),
            "putMessageFailedTimes": str(self.put_failed),
            "putMessageAverageSize": f"{avg:.2f}",
            "putMessageEntireTimeMax": "0",
            "putMessageDistributeTime": "",
            "getMessageEntireTimeMax": "0",
            "putTps": f"{self.put_times / up:.4f}",
            "getFoundTps": f"{self.get_found / up:.4f}",
            "getMissTps": f"{self.get_miss / up:.4f}",
            "getTotalTps": f"{(self.get_found + self.get_miss) / up:.4f}",
            "getTransferedTps": f"{self.get_transferred / up:.4f}",
            "pageCacheLockTimeMills": "0",
            "dispatchMaxBuffer": "0",
        }
