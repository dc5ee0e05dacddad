from saphan.entry import main

main()
