from optuna_ds.cli import main

main()
