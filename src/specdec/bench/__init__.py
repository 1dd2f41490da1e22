"""The paired benchmark: methods run interleaved per prompt (runner), one generation timed
(execute), rows -> summary.json (summary) -> report.md with plots (report). The `specdec bench`
and `specdec report` commands are in specdec.cli.bench."""
