"""What watches a run from the kernel: the run's outputs, each an ``Observer`` with one job.

``base`` declares what observers are told (``Observer``) and with what (``RunInfo`` when the run
starts, ``Tick`` at the board's pace, ``RunEnd`` once); ``watch.Watch`` folds what the ranks send
(``board.collector.Collector``) and tells every observer; ``assembly.assemble`` puts a run's
observers together from its typed options, one line each. Each other module is one output: the
run store (``store``), the ranks' health rows (``health``), the live dashboard (``dashboard``),
the experiment trackers (``trackers``), TensorBoard (``tensorboard``), ``--stop-on-nan``
(``stop_on_nan``) and ``--profile``'s table and trace (``profile``). Observers import the boards,
trackers and debug rooms beneath; none imports another observer.
"""
