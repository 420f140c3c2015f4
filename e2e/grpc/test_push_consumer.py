"""The 5.x PushConsumer over gRPC: every message is consumed, and one whose consumption failed
is delivered again with its delivery attempt raised."""

from quiver_e2e import wait_until
from v5 import Recorder, message, producer, push_consumer


def test_push_consumer_consumes_everything_and_retries_a_failure(broker):
    topic, group = "PushTopic", "push-readers"
    broker.create_topic(topic)
    broker.create_group(group)
    broker.from_earliest(group, topic)
    bodies = [f"p-{i}" for i in range(20)]
    recorder = Recorder(fail_first={"p-3"})
    with push_consumer(broker, group, topic, recorder):
        with producer(broker, [topic]) as p:
            for body in bodies:
                p.send(message(topic, body, tag="TagA"))
        wait_until(lambda: set(recorder.bodies()) == set(bodies) and recorder.attempts("p-3") == [1, 2],
                   90, "every message consumed and p-3 delivered twice")
    for body in bodies:
        if body != "p-3":
            assert recorder.attempts(body) == [1], body
