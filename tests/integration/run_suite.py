"""run_suite.py — how ctest runs one integration test file: unittest over
the module named on the command line, exiting 0 when every test passed,
1 when one failed or errored, and SKIP_STATUS (77, the SKIP_RETURN_CODE
CMakeLists.txt gives every integration test) when none failed but some
were skipped, so that ctest reports the file as Skipped instead of Passed.
The skipped tests and their reasons are printed last.

Usage: python3 run_suite.py test_NAME [unittest names...]"""

import sys
import unittest

SKIP_STATUS = 77


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__ + "\n")
        return 2
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromNames(argv[1:])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.skipped:
        sys.stderr.write("\n%d of %d tests skipped (ctest shows the file as Skipped):\n"
                         % (len(result.skipped), result.testsRun))
        for test, why in result.skipped:
            sys.stderr.write("  %s: %s\n" % (test.id(), why))
        return SKIP_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
