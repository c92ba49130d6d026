"""What a unit records: the columns of the step and replicate tables (:mod:`.schema`) and the
per-trajectory terms they hold (:mod:`.terms`). Below both ``run/``, which writes records,
and ``analysis/``, which reads them."""
