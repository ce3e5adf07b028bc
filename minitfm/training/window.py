"""The log line: the updates since the previous one, summed, read from the device once, checked
and written to ``log.jsonl`` (one JSON object a line: step, loss and NLL per target token, the
learning rate, tokens, tokens per second, training seconds, the gradient norm when clipping).

The losses of the updates are 0-d arrays, summed on the device as they come; only the log line
reads them, together, so an update never waits for the device. A NaN or Inf loss or gradient
norm stops the run here (:func:`~minitfm.training.divergence.check_finite`), naming the window's
steps.
"""

from __future__ import annotations

from minitfm import backend
from minitfm.training.divergence import check_finite
from minitfm.training.run import Run

__all__ = ["LogWindow"]


class LogWindow:
    """The updates since the last log line: their loss and NLL sums, tokens and seconds."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.loss, self.nll, self.tokens, self.seconds, self.steps = 0.0, 0.0, 0, 0.0, 0

    def add(self, stats: dict, seconds: float) -> None:
        self.loss = self.loss + stats["loss"] * stats["tokens"]     # 0-d arrays: not read yet
        self.nll = self.nll + stats["nll"] * stats["tokens"]
        self.tokens += stats["tokens"]
        self.seconds += seconds
        self.steps += 1

    def log(self, run: Run, stats: dict, bar) -> float:
        """Append the log line of the window that ends now and start a new window; return its
        loss per token (the same on every worker)."""
        state, world = run.state, run.world
        read = [self.loss, self.nll] + ([stats["grad_norm"]] if "grad_norm" in stats else [])
        scaler = [] if state.scaler is None else [state.scaler.state]
        host = backend.to_host_together(*read, *scaler)              # wait for them here, once
        scaled = host.pop() if scaler else None
        sums = [float(v) for v in host]
        grad_norm = sums.pop() if "grad_norm" in stats else None
        if scaler and scaled[3]:         # the latest update was skipped: its norm is not finite
            grad_norm = None
        if world.distributed:
            sums = world.allreduce_numbers(sums)                     # this worker's part: sum
        loss, nll = sums[0] / self.tokens, sums[1] / self.tokens     # tokens: all workers'
        check_finite(loss, nll, grad_norm, self.steps, state)
        record = {"step": state.step, "loss": loss, "nll": nll, "lr": stats["lr"],
                  "tokens": state.tokens, "tokens_per_s": self.tokens / max(self.seconds, 1e-9),
                  "elapsed": round(state.elapsed, 3)}
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        if scaler:                       # the loss scale now, and the updates skipped so far
            record.update(loss_scale=float(scaled[0]), skipped=int(scaled[2]))
        if run.run_dir:
            run.run_dir.append_log(record, state.last_checkpoint)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{record['lr']:.2e}",
                        tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
        self._reset()
        return loss
