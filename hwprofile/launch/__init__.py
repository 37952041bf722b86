"""Running a plan: the one door every start goes through, and what reads and ends what runs.

- :mod:`.start`: the checks before a start and the only place a supervisor is built
  (:func:`~.start.supervisor`), supervising in the foreground, serving for a ``with`` block;
- :mod:`.detached`: a launch that returns once its plan is ready (the launch file, the detached
  supervisor); :mod:`.demo`: ``launch --demo``;
- :mod:`.status`: what runs, checked, and its text; :mod:`.stop`: stopping it;
- :mod:`.linkcheck`: the interconnect check before a TP group's first start on links never proven
  (recorded, then planned again; refused where the all-reduce is wrong in every mode).
- :mod:`.tinymodel`: the demo's tiny model, generated offline (``python -m hwprofile.launch.tinymodel``).
"""
