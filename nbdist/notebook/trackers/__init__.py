"""Experiment trackers (MLflow, Weights & Biases, Comet) fed from the kernel, never the ranks.

``sinks`` holds the protocol every tracker follows, the names ``--track`` takes and the fan-out
that runs each tracker on a thread of its own; ``live`` turns a run's collector into what the
trackers are sent (batched once a second); ``mlflow_sink``, ``wandb_sink`` and ``comet_sink``
speak to each library, imported only when asked for; ``export`` sends a finished run from the
run store (``nbdist.runs()[i].to_mlflow()``).
"""
