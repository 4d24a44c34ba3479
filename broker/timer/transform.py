"""The send side of timers: which sends are timer messages and how they are stored
(RocketMQ 5 ``HookUtils.checkIfTimerMessage`` / ``transformTimerMessage``).  Sans-I/O.

A timer send's properties are rewritten in place (``TIMER_OUT_MS``, ``REAL_TOPIC``,
``REAL_QID``) and the caller stores the record in ``rmq_sys_wheel_timer`` queue 0; see the
package docstring for the whole design.
"""

from __future__ import annotations

import enum

import attrs

from common.message_properties import MessageConst
from common.topics import TIMER_TOPIC

TIMER_QUEUE_ID = 0
_TIMER_KEYS = (
    MessageConst.TIMER_DELIVER_MS,
    MessageConst.TIMER_DELAY_SEC,
    MessageConst.TIMER_DELAY_MS,
)
_TIMER_KEY_SET = frozenset(_TIMER_KEYS)  # has_timer_property: one C-level test per send


class TimerVerdict(enum.Enum):
    NOT_TIMER = "not a timer message"  # store as asked
    TIMER = "timer message"  # store in the timer topic
    ILLEGAL = "illegal"  # unparsable, too far, or a deletion for a past time
    NOT_ENABLED = "not enabled"  # timerWheelEnable is off


@attrs.frozen
class TimerSettings:
    enable: bool = True
    max_delay_sec: int = 3 * 24 * 3600
    precision_ms: int = 1000


def illegal_remark(settings: TimerSettings) -> str:
    """RocketMQ 5's remark for WHEEL_TIMER_MSG_ILLEGAL (answered as MESSAGE_ILLEGAL)."""
    return (
        "timer message illegal, the delay time should not be bigger than the max delay "
        f"{settings.max_delay_sec * 1000}ms; or if set del msg, the delay time should be bigger "
        "than the current time"
    )


def not_enabled_remark(settings: TimerSettings) -> str:
    """RocketMQ 5's remark for WHEEL_TIMER_NOT_ENABLE (answered as SYSTEM_ERROR)."""
    return (
        f"accurate timer message is not enabled, timerWheelEnable is {str(settings.enable).lower()}"
    )


def has_timer_property(props: dict[str, str]) -> bool:
    return not _TIMER_KEY_SET.isdisjoint(props)


def out_ms(deliver_ms: int, precision_ms: int) -> int:
    """``TIMER_OUT_MS`` for an asked deliver time: the start of the precision slot just before
    it (RocketMQ's rounding: an exact multiple goes one slot down), so the slot's end
    (``out + precision``) is the first slot boundary at or after the asked time."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms // precision_ms * precision_ms


def fire_ms(timer_out_ms: int, precision_ms: int) -> int:
    """When the slot of ``TIMER_OUT_MS`` fires: its end, never before the asked time."""
    return timer_out_ms + precision_ms


def transform_timer_message(
    topic: str, queue_id: int, props: dict[str, str], now_ms: int, settings: TimerSettings
) -> TimerVerdict:
    """Decide and, for TIMER, rewrite ``props`` (the caller then stores in TIMER_TOPIC/0)."""
    if topic == TIMER_TOPIC or MessageConst.TIMER_OUT_MS in props:
        return TimerVerdict.NOT_TIMER  # already a timer record (a roll, a delivery)
    if props.get(MessageConst.DELAY, "0") not in ("", "0"):
        # a 4.x delay level wins; the timer properties are dropped (RocketMQ does the same)
        for k in _TIMER_KEYS:
            props.pop(k, None)
        return TimerVerdict.NOT_TIMER
    if not has_timer_property(props):
        return TimerVerdict.NOT_TIMER
    if not settings.enable:
        return TimerVerdict.NOT_ENABLED
    try:
        if MessageConst.TIMER_DELAY_SEC in props:
            deliver = now_ms + int(props[MessageConst.TIMER_DELAY_SEC]) * 1000
        elif MessageConst.TIMER_DELAY_MS in props:
            deliver = now_ms + int(props[MessageConst.TIMER_DELAY_MS])
        else:
            deliver = int(props[MessageConst.TIMER_DELIVER_MS])
    except ValueError:
        return TimerVerdict.ILLEGAL
    if deliver <= now_ms:
        if MessageConst.TIMER_DEL_UNIQKEY in props:
            return TimerVerdict.ILLEGAL
        return TimerVerdict.NOT_TIMER  # due already: stored under its own topic
    if deliver - now_ms > settings.max_delay_sec * 1000:
        return TimerVerdict.ILLEGAL
    props[MessageConst.TIMER_OUT_MS] = str(out_ms(deliver, settings.precision_ms))
    props[MessageConst.REAL_TOPIC] = topic
    props[MessageConst.REAL_QID] = str(queue_id)
    return TimerVerdict.TIMER
