"""What the pool service and the observer share: settings, errors, auth,
serving, figures, the frontend's files.
"""
