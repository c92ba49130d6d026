"""The study report's sections, one module each, in the report's order: each turns a
:class:`~kvdrift.analysis.results.StudyAnalysis` into a :class:`~kvdrift.report.page_model.Section`
(the paper's tables are :func:`kvdrift.report.paper.paper_section`)."""
