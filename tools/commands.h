/* The `lumen` CLI's subcommands: each is a thin program over lumen.h and the internal
 * layers, with argv starting at the subcommand's own name. */
#ifndef LM_TOOLS_COMMANDS_H
#define LM_TOOLS_COMMANDS_H

int cmd_pull(int argc, char **argv);     /* tools/cmd_pull.c     */
int cmd_inspect(int argc, char **argv);  /* tools/cmd_inspect.c  */
int cmd_run(int argc, char **argv);      /* tools/cmd_run.c      */
int cmd_chat(int argc, char **argv);     /* tools/cmd_chat.c     */
int cmd_tokenize(int argc, char **argv); /* tools/cmd_tokenize.c */
int cmd_convert(int argc, char **argv);  /* tools/cmd_convert.c  */
int cmd_bench(int argc, char **argv);    /* tools/cmd_bench.c    */
int cmd_adapter(int argc, char **argv);  /* tools/cmd_adapter.c  */
int cmd_fuse(int argc, char **argv);     /* tools/cmd_fuse.c     */

#endif
