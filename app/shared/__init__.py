"""What the pool service and the observer share: settings, errors, auth,
serving, the frontend's files (counters: blockpool.common.figures).
"""
