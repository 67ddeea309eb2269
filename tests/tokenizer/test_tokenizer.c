#include "rw_test.h"
#include "rw_tokenizer.h"
static void placeholder(void **s) { (void)s; }
int main(void) { const struct CMUnitTest t[] = {cmocka_unit_test(placeholder)}; return cmocka_run_group_tests(t, NULL, NULL); }
