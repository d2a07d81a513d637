"""The practitioner's kit around each worker's step: the optimizer (optimizers.py), its
learning-rate schedule and clipping (schedule.py), mixed precision (precision.py) and
micro-batch accumulation (accumulate.py)."""
