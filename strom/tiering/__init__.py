"""The lake tiering service: a PySpark application that keeps each lake-enabled table's lake copy fresh.

:mod:`~strom.tiering.driver` talks to the coordinator and runs one Spark job per table round;
:mod:`~strom.tiering.splits` plans a round, :mod:`~strom.tiering.tasks` is what a Spark task runs, and
:mod:`~strom.tiering.commit` commits a round exactly once.
"""
