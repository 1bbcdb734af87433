"""The benchmark scripts of attention_zoo_keras, run as modules from the
repository root: ``python -m benchmarks.bert_benchmark ...``, or all
backends at once with ``bash benchmarks/run.sh NAME ...``.

Deliberately empty: importing ``benchmarks.timing`` (or any helper module)
must not import numpy, Keras or a backend, because the scripts set the
thread and device environment variables before those are imported.
"""
