"""Production traces in the service: the live trace driver, the planner and the
``blockpool trace`` command.
"""
