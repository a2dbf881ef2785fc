"""The order in which the suite hands out its test files (conftest.py)."""

# The test files that take longest, started first (their seconds in a
# fresh-clone CI run on two cores, all their tests together): xdist hands
# out whole files (--dist loadfile), and a long one handed out last runs
# alone at the end. xdist would put the one-test files last (it orders
# files by their number of tests; pytest's addopts turn that off), so the
# others follow in that order (conftest.py). 698.8 -> 651.0 s for the suite.
LONGEST_FIRST = (
    "elastic/loop_test.py",                # 194
    "conformance/jax_suite_test.py",       # 190
    "elastic/pathwaysutils_test.py",       # 162
    "elastic/capped_client_test.py",       # 98 (loaded), 26 alone
    "deploy/ray_test.py",                  # 86
    "sanitizers/address_test.py",          # 81, with its build
    "examples_test.py",                    # 74
    "failure/global_rejoin_test.py",       # 69
    "cluster/by_hand_test.py",             # 63
    "sanitizers/thread_test.py",           # 59
    "clients/ordering_test.py",            # 53
    "failure/process_death_test.py",       # 47
    "failure/lost_stage_test.py",          # 46
    "clients/program_lifetime_test.py",    # 43
    "initialize_test.py",                  # 43
    "failure/controller_liveness_test.py",  # 40
    "conformance/moe_test.py",             # 36
)
