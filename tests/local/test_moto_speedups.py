"""moto's memoized lookups (mtrl/local/moto_speedups.py) answer exactly as the originals; the
collector's tuning for a run (mtrl/local/session.py) is undone after it."""

from __future__ import annotations

import gc
from datetime import datetime

import moto.core.responses
import moto.core.utils
import moto.sqs.models
from moto.sqs.models import Queue
from moto.sqs.responses import SQSResponse

from mtrl.local import moto_speedups
from mtrl.local.aws import GC_THRESHOLDS, collector_tuned_for_serving


def test_the_cached_lookups_answer_as_the_originals() -> None:
    moto_speedups.install()
    moto_speedups.install()  # a second install changes nothing
    cached = moto.core.utils.camelcase_to_underscores
    names = [*Queue.BASE_ATTRIBUTES, *Queue.FIFO_ATTRIBUTES, "ReceiveMessage", "QueueArn", ""]
    assert [cached(name) for name in names] == [cached.__wrapped__(name) for name in names]
    assert cached("MessageRetentionPeriod") == "message_retention_period"
    # A module that imported the name before install uses the cached one too.
    assert moto.sqs.models.camelcase_to_underscores is cached
    assert moto.core.responses.camelcase_to_underscores is cached
    assert moto.core.responses.method_names_from_class(SQSResponse) == (
        moto.core.utils.method_names_from_class(SQSResponse)
    )


def test_the_cached_epoch_answers_as_the_original() -> None:
    moto_speedups.install()
    cached = moto.core.utils.utcfromtimestamp
    stamps = [0, 1, 1_700_000_000, 1_700_000_000.123456, -86_400]
    assert [cached(stamp) for stamp in stamps] == [cached.__wrapped__(stamp) for stamp in stamps]
    assert cached(0) == datetime(1970, 1, 1) and cached(0).tzinfo is None
    # unix_time reads it from moto.core.utils at each call: the same figures as before.
    moment = datetime(2026, 12, 7, 12, 30, 15, 250_000)
    assert moto.core.utils.unix_time(moment) == (moment - datetime(1970, 1, 1)).total_seconds()
    assert moto.core.utils.unix_time_millis(moment) == 1_796_646_615_250.0


def test_the_collector_is_tuned_for_a_run_and_restored_after_it() -> None:
    before = gc.get_threshold()
    with collector_tuned_for_serving():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
