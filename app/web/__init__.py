"""The HTTP pieces both apps are assembled from: the app factory, the error
shape, the docs page, the guards run before a route, the websocket fan-out.
"""
