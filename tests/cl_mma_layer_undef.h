/* Clears the macros a kernels_cl/mma_<layout>.h defines, so that
 * tests/test_mma_layouts.c can read every layout's index functions in one
 * translation unit. */
#undef FA_SG
#undef FA_M
#undef FA_N
#undef FA_K
#undef FA_A_WORDS
#undef FA_B_WORDS
#undef FA_C_ELEMS
#undef FA_C_ROWS
#undef FA_A_ROW
#undef FA_A_COL
#undef FA_B_K
#undef FA_B_N
#undef FA_C_ROW
#undef FA_C_COL
#undef FA_C_SLOT
#undef FA_C_SLOT_ROW
#undef FA_C_RUN
#undef FA_RED_STEPS
#undef FA_RED_MASK
#undef FA_C2A_REGS
#undef FA_C2A_TILE
#undef FA_C2A_ELEM
#undef FA_C2A_LANE
#undef FA_INSTR_F16
#undef FA_INSTR_BF16
#undef FA_SWAPPED
#undef FA_HALF_LANES
