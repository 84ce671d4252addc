"""Scheduling many training jobs on one shared cluster (issue 15; vTrain's second case study).

Data flows one way: a job trace (:mod:`.trace`) -> each job's time-versus-GPUs curve from one
sweep (:mod:`.curves`) -> a policy's allocations (:mod:`.policies`) replayed event by event
(:mod:`.replay`) -> per-job and total metrics, tables and a Gantt chart (:mod:`.gantt`).
"""
