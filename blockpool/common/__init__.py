"""Small helpers shared by the layers of the library: hash keys, histograms,
counters, the miss-reason names and tally, the eviction-cause codes, a
file read up to a bound.
"""
