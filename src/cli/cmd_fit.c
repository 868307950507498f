/* cmd_fit.c - placeholder */
#include "cli/cli.h"
int kiln_cmd_fit(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return KILN_EXIT_USAGE;
}
