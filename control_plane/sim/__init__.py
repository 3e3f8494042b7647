"""The fleet simulator: a roofline replica model driving the real quota, admission, queue and dispatch
policies on simulated time (docs/simulator.md)."""
