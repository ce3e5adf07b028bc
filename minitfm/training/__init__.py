"""Training: the loop the three trainers share, and the run it drives. Read in this order:

    loop.py        the loop alone: stream the batches, accumulate an update's gradients, clip,
                   Adam; then the hooks (log, validate, save, stop) when they are due
    run.py         Run: one run's options, model, state, run directory and workers; start or
                   resume (one check, one load), save, validate, stop
    resume.py      where a run starts: the latest checkpoint read and checked against the run,
                   or a fresh state; rank 0's shared with every worker
    state.py       TrainOptions, what the loop is told (the commands' parsed options), and
                   TrainState, where a run stands (what a checkpoint stores)
    plan.py        what the options come to once the data is known: the updates, the learning
                   rate of each, the update dropout starts at
    window.py      the log line of the updates since the previous one
    validation.py  the validation loss, and the record of what the run judged by it
    rundir.py      the files of a run directory: its lock, checkpoints, log.jsonl, run.json
    record.py      run.json, the record of a run: its start, every resume, each one's outcome
    stops.py       signals: stopping between updates, all workers together
    divergence.py  a loss that ran off
    phases.py      points and lengths of a run in updates or epochs

A program trains a model the way the commands do::

    with Run(options, kind) as run:
        run.start(cfg, valid_batches=...)
        state = loop.train(run, batches)
"""
