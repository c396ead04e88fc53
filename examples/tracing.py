"""OpenTelemetry across enqueue, claim and run (docs/tracing.md).

    pip install 'pgqueue[otel]' opentelemetry-sdk
    python examples/tracing.py

Uses DATABASE_URL, or else the embedded server in ./.pgqueue. Sets up the
OpenTelemetry SDK (here printing finished spans' names; in production an
OTLP exporter), enqueues a job inside a span of its own ("checkout", as a
web request's span would be), runs a worker until the job is done, and
prints the spans of the trace: the handler's run is a child of "checkout",
though it ran in the worker, after the enqueue had returned.
"""

import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgqueue import Job, Queue, migrate
from pgqueue.worker import Worker

spans = InMemorySpanExporter()  # in production: BatchSpanProcessor(OTLPSpanExporter())
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)  # before pgqueue makes its first span
tracer = trace.get_tracer("shop")


def send_receipt(job: Job) -> None:
    with tracer.start_as_current_span("render receipt"):  # a child of the attempt's span
        pass


with Queue() as queue:
    migrate(queue.url)
    with tracer.start_as_current_span("checkout"):
        job = queue.enqueue("send_receipt", {"order": 42}, metadata={"tenant": "acme"})
    worker = Worker({"send_receipt": send_receipt}, url=queue.url)

    def wait_then_stop() -> None:
        try:
            queue.wait(job.id, timeout=30)
        finally:
            worker.request_stop()

    threading.Thread(target=wait_then_stop).start()
    worker.run()
    print("metadata keys:", sorted(queue.get(job.id).metadata or {}))

checkout = next(s for s in spans.get_finished_spans() if s.name == "checkout")
names = {s.context.span_id: s.name for s in spans.get_finished_spans()}
for span in spans.get_finished_spans():
    if span.context.trace_id == checkout.context.trace_id and span.parent is not None:
        print(f"{span.name} <- {names.get(span.parent.span_id, 'remote')}")
