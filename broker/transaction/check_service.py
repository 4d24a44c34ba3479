"""The periodic check (RocketMQ ``TransactionalMessageCheckService``, apache/rocketmq 4.9).

``run_transaction_check`` runs on a master only: the broker service starts it on a master, the
DLedger role handler on the leader once it caught up, next to the delay-level scheduler, and
cancels it when the broker becomes a slave.  Every start rebuilds the service's ledger from the
persisted cursors and the log, so a master that restarts or a slave that takes over resumes
where the records say (see ``check.py``).  Every ``transactionCheckInterval`` one round
(``TransactionalMessageService.check``) runs; a round that fails is logged and the next one
tries again.
"""

from __future__ import annotations

import logging

import trio

from broker.transaction.service import CheckListener, TransactionalMessageService

log = logging.getLogger(__name__)


async def run_transaction_check(
    service: TransactionalMessageService,
    listener: CheckListener,
    interval: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    service.reset()
    try:
        task_status.started()
        while True:
            await trio.sleep(interval)
            try:
                n = await service.check(listener)
            except Exception:  # one bad round must not end checking (RocketMQ catches too)
                log.exception("transaction check round failed")
                continue
            if n:
                log.debug("transaction check round decided %d half messages", n)
    finally:
        # a slave again (or stopping): the next start rebuilds from the log
        service.reset()


__all__ = ["run_transaction_check"]
