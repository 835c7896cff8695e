"""librdkafka's offset queries while a partition's leadership moves: asked again, not fatal.

A worker restoring a partition right after a broker restart on the 3-node cluster exited on "Leader high
watermark is not caught up" (OFFSET_NOT_AVAILABLE): a new leader answers so until its high watermark has
caught up. The broker sequence is a race of the chaos test; here librdkafka's answers are given directly.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from rollout_stream.kafka import KafkaFailure, TopicPartition
from rollout_stream.kafka.confluent.assigned_consumer import _AssignedConsumer

TP = TopicPartition("t", 0)


class _Answers:
    """A librdkafka consumer whose watermark queries fail with `errors`, then answer (3, 9)."""

    def __init__(self, *errors: int) -> None:
        self.errors, self.asked = list(errors), 0

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 9


@pytest.mark.parametrize("code", [KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.LEADER_NOT_AVAILABLE])
def test_an_offset_query_during_a_leader_change_is_asked_again(code):
    answers = _Answers(code, code)
    consumer = _AssignedConsumer(answers, None)  # type: ignore[arg-type]
    assert consumer.end_offsets([TP]) == {TP: 9}
    assert consumer.beginning_offsets([TP]) == {TP: 3}
    assert answers.asked == 4


def test_any_other_failure_of_an_offset_query_is_raised():
    consumer = _AssignedConsumer(_Answers(KafkaError.TOPIC_AUTHORIZATION_FAILED), None)  # type: ignore[arg-type]
    with pytest.raises(KafkaFailure):
        consumer.end_offsets([TP])
