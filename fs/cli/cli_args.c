/* The command line of a subcommand. Every subcommand takes -o and --help and names its operands
 * the same way; only its own options differ, so those are the one thing a subcommand hands in. */
#include "cli_internal.h"

#include "common/command.h"

#include <getopt.h>

int cli_parse_threads(const char *cmd, const char *value, uint64_t *threads) {
    if (!cli_parse_u64(value, threads) || *threads == 0 || *threads > 256) {
        cli_error(cmd, "--threads: expected a number from 1 to 256, not %.40s", value);
        return CLI_USAGE;
    }
    return 0;
}

int cli_parse_args(cli_common *c, const cli_args *a, int argc, char **argv, bool *help_shown) {
    *help_shown = false;
    cli_start();
    int rc = 0, opt;
    opterr = 0; /* our messages name the subcommand and point at its --help */
    optind = 0; /* 0, not 1: getopt re-initialises, as the dispatcher may have parsed before */
    while (rc == 0 && (opt = getopt_long(argc, argv, a->shortopts, a->longopts, NULL)) != -1) {
        int letter = opt >= CLI_LONG ? opt - CLI_LONG : opt;
        if (opt == '?' || opt == ':')
            rc = cli_bad_option(c->cmd, optopt, argv[optind - 1], opt == ':');
        else if (letter == 'o')
            rc = cli_parse_o(c, optarg);
        else if (letter == 'h') {
            cli_out o;
            cli_out_init(&o, c->cmd);
            char line[512];
            command_usage_line(c->cmd, line, sizeof line);
            sb_puts(&o.sb, line);
            sb_puts(&o.sb, a->usage);
            *help_shown = true;
            return cli_out_finish(&o);
        } else
            rc = a->on_option(a->ctx, c->cmd, letter, optarg);
    }
    int operands = argc - optind;
    if (rc == 0 &&
        (operands < a->min_operands || (a->max_operands >= 0 && operands > a->max_operands))) {
        cli_error(c->cmd, "expected %s (see: ckptfs %s --help)", a->operands, c->cmd);
        rc = CLI_USAGE;
    }
    return rc;
}
