"""Results: collect the runs, analyse them, plot, render the reports, build the PDF."""
