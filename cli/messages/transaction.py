"""`rmq produce --transaction`: send messages in transactions, for trying transactions out.

Each body is one ``send_in_transaction`` (RocketMQ refuses transactional batches): a half
message, then the local transaction's outcome named by ``--transaction`` (commit, rollback,
or unknown: no decision, the broker checks back).  With ``--check-answer`` the command stays
connected after sending and answers the broker's check-backs with it, until every transaction
left unknown was checked back and ended, or ``check_wait`` seconds passed (the broker checks
every transactionCheckInterval, 60 s by default, once a half message is transactionTimeOut,
6 s, old).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import attrs
import trio

from cli.app import credentials_from_env
from cli.client_network import network_from_env
from common.message import MessageExt
from common.remoting.network import Network
from rmq import LocalTransactionState, TransactionProducer, TransactionSendResult
from rmq.message import Message


class Outcome(enum.Enum):
    """What the command says for a transaction (the CLI's spelling of LocalTransactionState)."""

    commit = "commit"
    rollback = "rollback"
    unknown = "unknown"

    @property
    def state(self) -> LocalTransactionState:
        return {
            Outcome.commit: LocalTransactionState.COMMIT_MESSAGE,
            Outcome.rollback: LocalTransactionState.ROLLBACK_MESSAGE,
            Outcome.unknown: LocalTransactionState.UNKNOW,
        }[self]


@attrs.define(eq=False)
class TransactionRun:
    results: list[TransactionSendResult] = attrs.Factory(list)
    # msgId -> the answer given to its check-back (the last one)
    checks: dict[str, LocalTransactionState] = attrs.Factory(dict)

    def unresolved(self) -> list[str]:
        """Transactions left unknown and not ended by a check-back answer yet."""
        ended = {k for k, v in self.checks.items() if v is not LocalTransactionState.UNKNOW}
        return [
            r.msg_id
            for r in self.results
            if r.local_transaction_state is LocalTransactionState.UNKNOW and r.msg_id not in ended
        ]


async def produce_in_transaction(
    namesrv: str,
    messages: Iterable[Message],
    *,
    group: str,
    outcome: Outcome,
    check_answer: Outcome | None = None,
    check_wait: float = 90.0,
    on_result: Callable[[TransactionSendResult], None] | None = None,
    on_check: Callable[[MessageExt, LocalTransactionState], None] | None = None,
    network: Network | None = None,
) -> TransactionRun:
    run = TransactionRun()
    everything_checked = trio.Event()

    def execute_local(msg: Message, arg: object) -> LocalTransactionState:
        return outcome.state

    def check_local(msg: MessageExt) -> LocalTransactionState:
        state = check_answer.state if check_answer is not None else LocalTransactionState.UNKNOW
        run.checks[msg.uniq_key or msg.msg_id] = state
        if on_check is not None:
            on_check(msg, state)
        if not run.unresolved():
            everything_checked.set()
        return state

    creds = credentials_from_env() if network is None else None
    if network is None:
        network = network_from_env()
    async with TransactionProducer(
        group,
        namesrv,
        network=network,
        credentials=creds,
        execute_local=execute_local,
        check_local=check_local if check_answer is not None else None,
    ) as producer:
        for msg in messages:
            result = await producer.send_in_transaction(msg)
            run.results.append(result)
            if on_result is not None:
                on_result(result)
        if check_answer is not None and run.unresolved():
            with trio.move_on_after(check_wait):
                await everything_checked.wait()
                # the answer is on its way: let it leave before the connection closes
                await trio.sleep(0.2)
    return run


__all__ = ["Outcome", "TransactionRun", "produce_in_transaction"]
