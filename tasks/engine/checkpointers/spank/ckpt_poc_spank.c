/*
 * ckpt-poc SPANK plugin: one sbatch/srun flag, --ckpt-poc, that opts a job in to the PoC.
 *
 * Loaded through a drop-in that install writes under the plugstack include folder
 * (Debian: /etc/slurm/plugstack.conf.d/ckpt-poc-<poc>.conf):
 *
 *     optional <prefix>/lib/ckpt_poc_spank.so poc=<poc> prefix=<prefix>
 *
 * It checkpoints nothing itself. In an opted-in job's tasks it sets CKPT_POC_MANAGED=<poc>
 * and CKPT_POC_CRIU=<prefix>/bin/criu, which the managed-job wrapper (<prefix>/bin/ckpt-poc-job)
 * reads: the wrapper takes CRIU dumps only when CKPT_POC_MANAGED names its PoC. A job without
 * the flag gets neither variable. `optional`: a plugin that fails to load never fails a job.
 */
#include <slurm/spank.h>
#include <stdio.h>
#include <string.h>

SPANK_PLUGIN(ckpt_poc, 1);

static int opted_in = 0;
static char poc[128] = "";
static char criu[4096] = "";

static int on_flag(int val, const char *optarg, int remote)
{
    (void)val;
    (void)optarg;
    (void)remote;
    opted_in = 1;
    return 0;
}

static struct spank_option flag = {
    "ckpt-poc", NULL,
    "Opt this job in to the ckpt-poc CRIU checkpoint PoC (periodic CRIU dumps)", 0, 0,
    on_flag,
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "poc=", 4) == 0)
            snprintf(poc, sizeof poc, "%s", av[i] + 4);
        else if (strncmp(av[i], "prefix=", 7) == 0)
            snprintf(criu, sizeof criu, "%s/bin/criu", av[i] + 7);
    }
    /* Registered here (not only in spank_options[]): sbatch accepts it then. */
    return spank_option_register(sp, &flag) == ESPANK_SUCCESS ? 0 : -1;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!opted_in && spank_option_getopt(sp, &flag, NULL) != ESPANK_SUCCESS)
        return 0; /* not opted in: the job runs exactly as without the plugin */
    if (poc[0] == '\0')
        return 0;
    spank_setenv(sp, "CKPT_POC_MANAGED", poc, 1);
    if (criu[0] != '\0')
        spank_setenv(sp, "CKPT_POC_CRIU", criu, 1);
    return 0;
}
