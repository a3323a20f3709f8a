"""`python -m vrag_rollout.integrations.easyr1`: run from the importable package, not a `__main__`
copy, so the config class and the patches live under the name Ray workers resolve."""

from vrag_rollout.integrations.easyr1.entry import main

if __name__ == "__main__":
    main()
