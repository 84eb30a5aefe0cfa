"""The planner-quality laboratory: studies of how well the planner plans, run from the source tree's root as
`python -m experiments.<study>` (not installed with the package). experiments/README.md lists the studies and what
was retired from them. The studies use the libraries (snip_ops, the planner's public names) and the application
(snip_train); nothing outside experiments/ imports them."""
