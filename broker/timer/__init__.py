"""Timer messages: RocketMQ 5's "deliver at any time" (``store/timer/`` in apache/rocketmq 5).

Theory of operation
-------------------
*Send side* (``transform.py``, RocketMQ ``HookUtils.handleScheduleMessage``): a send whose
properties carry ``TIMER_DELIVER_MS`` (absolute epoch ms), ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS`` goes through the ordinary put path (``broker/processor/send.py``; the gRPC
SendMessage with ``delivery_timestamp`` only sets ``TIMER_DELIVER_MS``).  A deliver time in the
past is stored under its own topic at once.  A later one is rounded to the precision
(``timerPrecisionMs``), written to ``TIMER_OUT_MS``, the real topic/queue kept in
``REAL_TOPIC``/``REAL_QID``, and the record is stored in ``rmq_sys_wheel_timer`` queue 0.
Beyond ``timerMaxDelaySec``, or with an unparsable value, the send is refused with
MESSAGE_ILLEGAL and RocketMQ 5's remark; with ``timerWheelEnable`` off, SYSTEM_ERROR.  A 4.x
delay level (DELAY) wins over the timer properties, which are dropped, as in RocketMQ.

*Broker side* (``service.py``, RocketMQ ``TimerMessageStore``): on a master / DLedger leader only,
a task reads the timer queue (the enqueue cursor) into an in-memory wheel (``wheel.py``) of
``(commit log offset, size, timer queue offset)`` entries keyed by slot; a second cursor
trails one roll window behind for the far ones; another task fires due slots, re-reads each
record and puts it under its real topic/queue (or, for a far one, back into the timer topic: a
*roll*).  The CommitLog is the only durable timer state, so the timer messages replicate as
ordinary records and a new master resumes from what it has.

Invariants
----------
1. Never early: a slot whose ``TIMER_OUT_MS`` is t fires when the clock reaches t + precision
   (the slot's end), so a message is delivered no sooner than the time asked for and at most one
   precision plus the service's latency later.  (RocketMQ fires a slot at its start, up to one
   precision before the asked time; we chose the other side.)
2. Bounded memory: the wheel holds only timers due within the roll window
   (``timerRollWindowSlot`` slots, 3600 by default: one hour), and timers already overdue.  A
   timer due later than one window after it was stored is *far*: the enqueue cursor skips it;
   the far cursor looks at it once a window has passed since its store time, and then either
   puts it in the wheel (due within a window from now) or re-puts the record into the timer
   topic with ``TIMER_ROLL_TIMES`` + 1 (RocketMQ's roll), to be looked at again a window later.
   Between looks a far timer is only in the CommitLog; the far cursor holds nothing but its
   offset.  A 3-day timer is rolled about 72 times with the default window (RocketMQ's is two
   days on disk: ``timerRollWindowSlot`` trades memory for rolls).
3. Once: every record the service writes (delivery or roll) carries
   ``TIMER_QUEUE_OFFSET``, the timer-queue offset of the entry it resolves.  The checkpoint
   (``checkpoint.py``) names a *low watermark* (every entry below it is resolved), the entries
   above it already resolved, and a CommitLog position below every write not in that set.  On
   start the service reads the timer queue from the watermark, then scans the CommitLog from that
   position for ``TIMER_QUEUE_OFFSET`` markers, and only the entries resolved by neither are put
   in the wheel.  A delivery between the last checkpoint and a crash is found by the scan, so it
   is not repeated; a slave keeps a copy of its master's checkpoint (``checkpoint.py``); without
   any usable one the scan starts at the oldest timer record still stored, which is slower but
   equally exact.  The watermark stays behind the oldest far timer not looked at yet (at most
   one window), so a start scans about one window of CommitLog.  Within one master's life a
   re-put the store refused is retried; if the refused put landed after all (a DLedger entry a
   later leader commits), the message appears twice, as after a producer's retry.

The service's clock (``clock_ms``) follows the Trio clock from a wall-clock anchor taken when it
first runs (as ``broker/schedule.py`` does), so autojump tests see time pass; the send path
computes ``TIMER_DELAY_*`` deliver times from the same clock.
"""
