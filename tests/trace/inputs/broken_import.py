import not_a_module_anywhere  # IMPORT
