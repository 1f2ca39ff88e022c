"""Each finding's own figures, one module per finding named as its analysis in bsresearch.findings:
plots.findings.<name> draws what findings.<name> computes (its tables, fits and pre-registered tests),
each function on the Axes it is given. The analysis never imports these modules (no matplotlib there).

    from bsresearch.findings import keskar
    from bsresearch.plots.findings import keskar as keskar_plots
    keskar_plots.paired_test_plot(ax_ratio, ax_drop, keskar.paired_differences(runs, 32, 5000), test)
"""
