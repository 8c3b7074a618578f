"""moto's memoized lookups (mtrl/local/moto_speedups.py) answer exactly as the originals."""

from __future__ import annotations

import moto.core.responses
import moto.core.utils
import moto.sqs.models
from moto.sqs.models import Queue
from moto.sqs.responses import SQSResponse

from mtrl.local import moto_speedups


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
