"""`loopscale bench`: the performance table, every figure a ratio measured side by side in one
process (figures.py lists them with their targets).

    scale.py        model shapes and repetitions (FULL for the command, TINY for tests)
    timing.py       interleaved repetitions, medians
    steps.py        the trainer's own jitted step of an experiment, ready to time; compile time
                    and XLA's memory analysis of it
    lean.py         a lean plain-JAX step, the yardstick of the Base step
    torch_ref.py    the FLT authors' looped model as a PyTorch eager step (torch optional)
    sweep_share.py  a slice of the demo sweep, run once for the sweep rows: the share of its
                    time spent in train steps, and its train steps' FLOP rate
    figures.py      one function per figure
    result.py       a figure's row: ratio, target, verdict
    report.py       results.json and results.md
    suite.py        runs the figures and writes the results
"""
